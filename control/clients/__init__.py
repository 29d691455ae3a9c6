"""Clients of a specctl deployment (Triton's gRPC and HTTP APIs)."""
