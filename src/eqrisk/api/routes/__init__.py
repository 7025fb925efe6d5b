"""The routers of both services, named for the service they serve."""
