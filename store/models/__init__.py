"""Models, torch-free half: presets, transformers and plug-in models as a request names them,
generation settings (docs/models.md); the modules that build them are worker/models/.
"""
