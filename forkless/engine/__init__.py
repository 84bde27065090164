"""The engine: input processing, the engine core loop, output processing."""
