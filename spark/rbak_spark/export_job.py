"""Export a backup to Parquet through the ``rbak`` data source (for analysis).

    spark-submit spark/export.py --path URL --backup-id ID --output DIR
        [--prefix P] [--time-window-start T] [--time-window-end T]
        [--partition-by vhost,queue] [--mode errorifexists|overwrite|append]

One row per record (the data source's schema: see ``datasource.py``);
``--output`` is any path Spark can write (a local directory in tests).
"""

from __future__ import annotations

import argparse
import sys

from rbak.errors import RbakError


def run_export(spark, url: str, backup_id: str, output: str, prefix: str = "", partition_by: list[str] | None = None,
               mode: str = "errorifexists", time_window_start=None, time_window_end=None) -> int:
    """Write the Parquet files; returns the number of rows written."""
    from .datasource import read_backup

    df = read_backup(spark, url, backup_id, prefix, time_window_start=time_window_start,
                     time_window_end=time_window_end)
    writer = df.write.mode(mode)
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.parquet(output)
    return spark.read.parquet(output).count() if mode != "append" else -1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="spark/export.py", description="Write an rbak backup to Parquet.")
    ap.add_argument("--path", required=True, help="storage URL of the backups")
    ap.add_argument("--backup-id", required=True)
    ap.add_argument("--prefix", default="")
    ap.add_argument("--output", required=True, help="Parquet output directory")
    ap.add_argument("--partition-by", default="", help="comma-separated columns, e.g. vhost,queue")
    ap.add_argument("--mode", default="errorifexists", choices=["errorifexists", "overwrite", "append", "ignore"])
    ap.add_argument("--time-window-start")
    ap.add_argument("--time-window-end")
    ap.add_argument("--master", default=None)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    from .session import get_session, setup_logging

    setup_logging()
    args = parse_args(argv)
    cols = [c.strip() for c in args.partition_by.split(",") if c.strip()]
    try:
        spark = get_session(f"rbak-export-{args.backup_id}", args.master)
        n = run_export(spark, args.path, args.backup_id, args.output, args.prefix, cols, args.mode,
                       args.time_window_start, args.time_window_end)
    except RbakError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    print(f"export {args.backup_id}: {n if n >= 0 else 'appended'} row(s) written to {args.output}")
    return 0
