"""``python -m spconv --info``: print what the extension was compiled with."""
import argparse
import json

import spconv


def main():
    parser = argparse.ArgumentParser(prog="python -m spconv")
    parser.add_argument("--info", action="store_true", help="print build information as JSON")
    args = parser.parse_args()
    info = spconv.build_info()
    info["version"] = spconv.__version__
    info["dev_tag"] = spconv.__dev_tag__
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
