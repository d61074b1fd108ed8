# The version clients parse: plain 2.N.M digits only (OpenPCDet reads float(__version__[2:]), spconv 2.x code
# splits it into ints, mmdetection3d compares it as a string). setup.py reads the first double-quoted string in
# this file, so the version must stay the first one.
__version__ = "2.4.0"
# This project's development marker, kept out of __version__ so the parsers above keep working.
__dev_tag__ = "dev0"
