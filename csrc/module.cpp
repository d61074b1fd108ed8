// Importing spconv._C_hip loads this library, whose static initialisers register the torch ops.
// No pybind11: the module itself is empty. Its one Python API call is a weak reference, bound by the
// interpreter that imports the module, so the same file also loads into a C++ program without libpython
// (which never calls PyInit__C_hip): one build serves Python and C++ (spconv/include/spconv/ops.h).
#include <Python.h>

#pragma weak PyModule_Create2

static struct PyModuleDef spconv_module = {PyModuleDef_HEAD_INIT, "_C_hip", nullptr, -1, nullptr};

PyMODINIT_FUNC PyInit__C_hip(void) { return PyModule_Create(&spconv_module); }
