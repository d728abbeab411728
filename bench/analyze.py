"""`python -m bench analyze`: a PySpark job over any number of JSON-lines
logs (bench/SCHEMA.md) that writes the report: CSV and Markdown tables and
matplotlib plots.

Statistics are per configuration of one run (KEYS): requests give counts,
throughput, mean and exact percentiles (Spark's `percentile`, linear
interpolation between the closest ranks, as numpy's default; it keeps one
counter per distinct value of a group, and latencies are written to
0.1 µs, which is what keeps ten million of them small); throughput windows
give requests per second; events give the same statistics for each named
figure (a failover's view change, stall...).  Each row is set against the
rows of the unreplicated baseline (backend "plain") with the same run,
scenario, net, size, clients, nondet and ops, and throughput also against
the zero-cost ceiling (backend "ceiling").

A line that is not JSON, or lacks a field the schema requires, is counted
and reported (malformed.csv), never fatal; no input at all is an error."""
from __future__ import annotations

import csv
import glob
import os
import sys
import time
from pathlib import Path

from bench.records import BASELINE, KINDS, SCHEMA_VERSION

KEYS = ["run", "host", "commit", "suite", "scenario", "net", "backend", "variant", "replicas", "clients", "size",
        "nondet", "ops"]
# What a row shares with its baseline row (everything in KEYS but what is being compared).
MATCH = ["run", "scenario", "net", "size", "clients", "nondet", "ops"]
QUANTILES = (0.5, 0.9, 0.99, 0.999)
QNAMES = ("p50", "p90", "p99", "p999")


class NoInput(Exception):
    """Nothing to analyse: the one message the user sees, and a non-zero exit."""


def expand(inputs: list[str]) -> list[str]:
    """Files named, *.jsonl and *.jsonl.gz in directories named, and the
    files globs match (Spark reads a file ending in .gz as gzip)."""
    files, unmatched = [], []
    for item in inputs:
        if os.path.isdir(item):
            found = sorted(glob.glob(os.path.join(item, "*.jsonl")) + glob.glob(os.path.join(item, "*.jsonl.gz")))
        elif glob.has_magic(item):
            found = sorted(f for f in glob.glob(item, recursive=True) if os.path.isfile(f))
        else:
            found = [item] if os.path.isfile(item) else []
        (files.extend if found else lambda _: unmatched.append(item))(found)
    if not files:
        raise NoInput(f"no input: {', '.join(repr(i) for i in unmatched)} "
                      f"{'matches' if len(unmatched) == 1 else 'match'} no file of JSON lines")
    return list(dict.fromkeys(os.path.abspath(f) for f in files))


def schema():
    from pyspark.sql import types as T
    s, i, l, d = T.StringType(), T.IntegerType(), T.LongType(), T.DoubleType()
    return T.StructType([T.StructField(name, typ) for name, typ in [
        ("schema", i), ("run", s), ("host", s), ("commit", s), ("cpus", i), ("suite", s), ("kind", s),
        ("scenario", s), ("backend", s), ("variant", s), ("net", s), ("replicas", i), ("clients", i), ("size", l),
        ("nondet", l), ("ops", l), ("round", i), ("ts", d), ("latency_us", d), ("requests", l),
        ("duration_s", d), ("metrics", T.MapType(s, d)), ("outcome", s), ("error", s), ("_corrupt", s)]])


def session(master: str):
    from pyspark.sql import SparkSession
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")   # this host only: no warning about its name
    spark = (SparkSession.builder.master(master).appName("llft-bench-analyze")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "16")
             .config("spark.driver.memory", os.environ.get("BENCH_DRIVER_MEMORY", "4g"))
             .config("spark.driver.extraJavaOptions",
                     f"-Dlog4j2.configurationFile=file:{Path(__file__).with_name('log4j2.properties')}")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def load(spark, files: list[str]):
    """(records, malformed): the well-formed records, and the lines that are
    not, with their file and why."""
    from pyspark.sql import functions as F
    raw = (spark.read.schema(schema()).option("mode", "PERMISSIVE")
           .option("columnNameOfCorruptRecord", "_corrupt").json(files)
           .withColumn("file", F.input_file_name()))
    c = F.col
    reason = (F.when(c("_corrupt").isNotNull(), "not a JSON object of the schema's types")
              .when(c("schema").isNull(), "no schema version")
              .when(c("schema") != SCHEMA_VERSION, F.concat(F.lit("schema version "), c("schema").cast("string"),
                                                              F.lit(f", not {SCHEMA_VERSION}")))
              .when(~c("kind").isin(*KINDS) | c("kind").isNull(), "kind not one of " + "/".join(KINDS))
              .when(c("run").isNull() | c("scenario").isNull() | c("backend").isNull() | c("outcome").isNull(),
                    "run, scenario, backend or outcome missing")
              .when((c("kind") == "request") & (c("outcome") == "ok") & c("latency_us").isNull(),
                    "request without latency_us")
              .when((c("kind") == "window") & (c("outcome") == "ok")
                    & (c("requests").isNull() | c("duration_s").isNull() | (c("duration_s") <= 0)),
                    "window without requests or duration_s"))
    # Parsed once and kept: every table of the report queries it again.
    tagged = raw.withColumn("malformed", reason).persist()
    records = tagged.filter(c("malformed").isNull()).drop("_corrupt", "malformed")
    malformed = tagged.filter(c("malformed").isNotNull()).groupBy("file", "malformed").count()
    return records, malformed


def percentiles(column: str):
    from pyspark.sql import functions as F
    return F.expr(f"percentile({column}, array({', '.join(map(str, QUANTILES))}))")


def split_quantiles(df):
    """The array column q of percentiles() as one column per quantile (p50...)."""
    from pyspark.sql import functions as F
    for k, name in enumerate(QNAMES):
        df = df.withColumn(name, F.col("q")[k])
    return df.drop("q")


def against(df, other, backend: str, on: list[str], cols: dict[str, str]):
    """df with the columns of `other`'s rows of `backend` that match on `on`
    (null matching null), renamed as cols says."""
    from pyspark.sql import functions as F
    o = (other.filter(F.col("backend") == backend)
         .groupBy(*[F.col(k).alias(f"_m_{k}") for k in on])
         .agg(*[F.first(src).alias(dst) for src, dst in cols.items()]))
    return left_join(df, o, on)


def left_join(df, other, on: list[str]):
    """df left-joined to `other`, whose keys are named _m_KEY, null matching null."""
    from functools import reduce

    from pyspark.sql import functions as F
    cond = reduce(lambda a, b: a & b, [F.col(k).eqNullSafe(F.col(f"_m_{k}")) for k in on])
    return df.join(other, cond, "left").drop(*[f"_m_{k}" for k in on])


def latency_stats(records):
    from pyspark.sql import functions as F
    c = F.col
    req = records.filter(c("kind") == "request")
    ok = c("outcome") == "ok"
    stats = req.groupBy(*KEYS).agg(
        F.count(F.when(ok, 1)).alias("count"), F.count(F.when(~ok, 1)).alias("failed"),
        F.avg(F.when(ok, c("latency_us"))).alias("mean_us"), percentiles("latency_us").alias("q"),
        F.max(F.when(ok, c("latency_us"))).alias("max_us"),
        F.min("ts").alias("first_ts"), F.max(c("ts") + c("latency_us") / 1e6).alias("last_ts"))
    stats = split_quantiles(stats).withColumn("rps", c("count") / (c("last_ts") - c("first_ts")))
    for name in QNAMES:
        stats = stats.withColumnRenamed(name, f"{name}_us")
    stats = against(stats, stats, BASELINE, MATCH, {"p50_us": "base_p50_us", "p99_us": "base_p99_us",
                                                    "mean_us": "base_mean_us"})
    return (stats.withColumn("added_p50_us", c("p50_us") - c("base_p50_us"))
            .withColumn("ratio_p50", c("p50_us") / c("base_p50_us"))
            .withColumn("ratio_p99", c("p99_us") / c("base_p99_us"))
            .withColumn("ratio_mean", c("mean_us") / c("base_mean_us")))


def throughput_stats(records):
    from pyspark.sql import functions as F
    c = F.col
    ok = c("outcome") == "ok"
    win = records.filter(c("kind") == "window").withColumn("wrps", c("requests") / c("duration_s"))
    stats = win.groupBy(*KEYS).agg(
        F.count(F.when(ok, 1)).alias("windows"), F.count(F.when(~ok, 1)).alias("failed"),
        F.sum(F.when(ok, c("requests"))).alias("requests"), F.sum(F.when(ok, c("duration_s"))).alias("seconds"),
        F.expr("percentile(wrps, 0.5)").alias("rps_p50"), F.min("wrps").alias("rps_min"),
        F.max("wrps").alias("rps_max"))
    stats = stats.withColumn("rps", c("requests") / c("seconds"))
    stats = against(stats, stats, BASELINE, MATCH, {"rps": "base_rps"})
    stats = against(stats, stats, "ceiling", MATCH + ["replicas"], {"rps": "ceiling_rps"})
    return (stats.withColumn("ratio_rps", c("rps") / c("base_rps"))
            .withColumn("ratio_ceiling", c("rps") / c("ceiling_rps")))


def event_stats(records):
    from pyspark.sql import functions as F
    c = F.col
    ev = records.filter(c("kind") == "event")
    failed = (ev.filter(c("outcome") != "ok").groupBy(*[c(k).alias(f"_m_{k}") for k in KEYS])
              .agg(F.count("*").alias("failed")))
    values = ev.filter(c("outcome") == "ok").select(*KEYS, F.explode("metrics").alias("metric", "value"))
    stats = values.groupBy(*KEYS, "metric").agg(
        F.count("value").alias("count"), F.avg("value").alias("mean"), percentiles("value").alias("q"),
        F.min("value").alias("min"), F.max("value").alias("max"))
    stats = split_quantiles(stats)
    stats = against(stats, stats, BASELINE, MATCH + ["metric"], {"p50": "base_p50"})
    stats = left_join(stats, failed, KEYS)
    return (stats.withColumn("failed", F.coalesce(c("failed"), F.lit(0)))
            .withColumn("added_p50", c("p50") - c("base_p50"))
            .withColumn("ratio_p50", c("p50") / c("base_p50")))


def rows(df, order: list[str]) -> list[dict]:
    return [r.asDict() for r in df.orderBy(*order).collect()]


def write_csv(path: Path, data: list[dict]):
    with open(path, "w", newline="") as f:
        if data:
            w = csv.DictWriter(f, fieldnames=list(data[0]))
            w.writeheader()
            w.writerows(data)


def analyze(spark, files: list[str], out: Path) -> dict:
    """Computes every table, writes the CSV files; returns the tables as lists of dicts."""
    from pyspark.sql import functions as F
    records, malformed = load(spark, files)
    counts = {r["kind"]: r["count"] for r in records.groupBy("kind").count().collect()}
    bad = rows(malformed, ["file", "malformed"])
    if not counts:
        raise NoInput(f"no record in {len(files)} file{'s' * (len(files) != 1)}"
                      + (f" ({sum(r['count'] for r in bad)} malformed lines)" if bad else ""))
    order = ["run", "net", "scenario", "variant", "size", "clients", "nondet", "replicas", "backend"]
    tables = {"latency": rows(latency_stats(records), order),
              "throughput": rows(throughput_stats(records), order),
              "events": rows(event_stats(records), order + ["metric"]),
              "malformed": bad,
              "runs": rows(records.groupBy("run", "host", "commit", "suite").agg(
                  F.count("*").alias("records"), F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts")),
                  ["first_ts"])}
    spark.catalog.clearCache()     # the parsed input load() kept for these queries
    out.mkdir(parents=True, exist_ok=True)
    for name, data in tables.items():
        write_csv(out / f"{name}.csv", data)
    tables["counts"] = counts
    return tables


def main(inputs: list[str], out: Path, master: str = "local[*]", readme: Path | None = None, spark=None) -> int:
    """The whole job; with `spark`, in that session (left running), else in one of its own on `master`."""
    try:
        files = expand(inputs)
    except NoInput as e:
        print(f"bench analyze: {e}", file=sys.stderr)
        return 2
    started = time.monotonic()
    own = spark is None
    spark = session(master) if own else spark
    try:
        tables = analyze(spark, files, out)
    except NoInput as e:
        print(f"bench analyze: {e}", file=sys.stderr)
        return 2
    finally:
        if own:
            spark.stop()
    from bench import plots, report
    figures = plots.draw(tables, out)
    report.write(tables, figures, out, readme)
    n = sum(tables["counts"].values())
    bad = sum(r["count"] for r in tables["malformed"])
    print(f"bench analyze: {n:,} records from {len(files)} file{'s' * (len(files) != 1)} in "
          f"{time.monotonic() - started:.1f} s; {len(figures)} plots; report in {out}/")
    if bad:
        print(f"bench analyze: {bad:,} malformed lines skipped ({out / 'malformed.csv'}):", file=sys.stderr)
        for r in tables["malformed"]:
            print(f"  {r['count']:>8,}  {r['file']}: {r['malformed']}", file=sys.stderr)
    return 0
