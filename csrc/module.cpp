// Importing spconv._C_hip loads this library, whose static initialisers register the torch ops.
// No pybind11: the module itself is empty.
#include <Python.h>

static struct PyModuleDef spconv_module = {PyModuleDef_HEAD_INIT, "_C_hip", nullptr, -1, nullptr};

PyMODINIT_FUNC PyInit__C_hip(void) { return PyModule_Create(&spconv_module); }
