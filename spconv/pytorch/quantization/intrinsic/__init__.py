from .modules import SpconvAddReLUNd, SpconvBnAddReLUNd, SpconvBnNd, SpconvBnReLUNd, SpconvReLUNd  # noqa: F401
