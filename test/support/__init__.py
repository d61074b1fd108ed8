"""Shared helpers of the tests: dense and integer references, sparse-input builders, launch counting, the
networks that the export, compile and client-compatibility tests run, and the spconv 2.3.8 reference worker."""
