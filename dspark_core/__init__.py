"""The bundled DSpark engine: a standalone package that imports nothing else from dspark-tune."""
