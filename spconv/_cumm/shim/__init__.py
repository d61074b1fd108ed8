# Holds the stand-in package ``cumm``; import it as ``cumm`` (through spconv._cumm.finder), not from here.
