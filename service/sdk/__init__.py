"""The Python SDK: every API call defined once (`calls`, `steps`) and two clients that perform
them (`client.TrainctlClient`, `async_client.AsyncTrainctlClient`). The SDK is what a laptop
installs: it imports neither FastAPI, SQLAlchemy, fcntl nor the checkpoint store
(tests/test_architecture.py). `from trainctl import Client` is the way in."""
