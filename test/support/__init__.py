"""Shared helpers of the tests: dense and integer references, sparse-input builders, conv, pool and int8 cases,
small networks and scenes, launch counting, fp16/bf16 tiles for the matrix-core emulators, the networks that the
export, compile and client-compatibility tests run, and the spconv 2.3.8 reference worker."""
