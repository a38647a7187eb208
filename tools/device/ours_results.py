"""The device scripts' shared reading of tierd-train's logs: each run's last `result:` line."""
import json
import re


def load(logs, names):
    """{name: result} from logs/ours-NAME.log; says which runs left no result line."""
    rows = {}
    for name in names:
        try:
            text = open(f"{logs}/ours-{name}.log").read()
            rows[name] = json.loads(re.findall(r"^result: (.*)$", text, re.M)[-1])
        except (OSError, IndexError, ValueError):
            print(f"{name}: no result line")
    return rows
