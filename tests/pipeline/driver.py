"""A long-lived ``tarry`` process for the cluster tests: it runs the CLI commands sent to it, one
at a time, in one process, so they share one Spark session: one application on the standalone
cluster, whose executors start once, or one Spark Connect client.

Each command runs as ``tarry ARGS`` would (click's runner, the same ``spark_session`` call,
which finds the session this process made at its start with the same settings). What differs
from a fresh process is only that the JVM, the executors and the unpacked bundle are warm: the
fresh-process path is covered by the test of executors without pyarrow, which must start its own
application anyway.

Protocol: one JSON list of arguments per line on stdin; one JSON object per line
(``exit_code``, ``stdout``, ``stderr``) on the file descriptor given as the first argument.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    replies = os.fdopen(int(sys.argv[1]), "w")
    where = sys.argv[2:]  # --master URL or --remote URL

    from click.testing import CliRunner

    from tarry.cli.main import cli
    from tarry.pipeline.session import SparkSettings, spark_session

    if where[0] == "--master":  # a light JVM, as the tests' local[2] session
        spark_session(SparkSettings(master=where[1], driver_memory="1g", light_jvm=True))
    else:
        spark_session(SparkSettings(remote=where[1]))
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in sys.stdin:
        result = CliRunner().invoke(cli, [*json.loads(line), *where])
        reply = {"exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr}
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            reply["stderr"] += f"\n{type(result.exception).__name__}: {result.exception}"
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
