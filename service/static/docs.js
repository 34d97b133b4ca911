// The API docs page (/docs): Swagger UI on the service's own schema. A file, not an inline
// script, since the Content-Security-Policy allows scripts from 'self' only.
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  layout: "BaseLayout",
  presets: [SwaggerUIBundle.presets.apis],
  validatorUrl: null,  // swagger.io's validator badge would be a request off the node
});
