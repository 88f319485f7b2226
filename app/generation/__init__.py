"""One generation request, whatever its protocol: its checks, the traffic layers, the engine's
outputs collected or streamed."""
