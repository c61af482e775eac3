"""Console + file output for the device scripts: say(...) prints a line and appends it to $OUT/<name> when OUT
is set (flushed per line, so a run cut short still leaves its lines)."""
import os


def teller(name: str):
    log = open(os.path.join(os.environ["OUT"], name), "w") if os.environ.get("OUT") else None

    def say(*a):
        line = " ".join(str(x) for x in a)
        print(line, flush=True)
        if log:
            log.write(line + "\n")
            log.flush()
    return say
