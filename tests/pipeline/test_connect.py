"""``tarry pipeline import`` and ``report`` over Spark Connect (``--remote sc://``): the Connect
server the pyspark package ships, on a standalone cluster whose executors run a bare Python
without tarry; the results equal ``local[2]``'s row for row, reruns store nothing twice, and a
path the executors cannot see is named before any work (``cluster_runs.ClusterSuite``)."""

from __future__ import annotations

import pytest

from tests.pipeline.cluster_runs import ClusterSuite

#: The first test also waits for the session's cluster and local[2]'s reference runs.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(400)]


class TestOverSparkConnect(ClusterSuite):
    mode = "connect"
