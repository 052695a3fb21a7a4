"""The buffer's transports: gRPC (server, client, protobuf conversion, status codes, token
check) and REST (FastAPI app, HTTP guard). Nothing is imported here, so that the searcher and
trainer can import `grpc_client` without loading FastAPI, uvicorn or Redis."""
