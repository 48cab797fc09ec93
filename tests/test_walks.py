"""Issue 32's walks: the storage a restore is given goes down one path, through few modules.

``run_restore`` opens a ``restore.source.BackupSource`` on its storage; every other restore
module works on the source. Before it the storage argument reached 10 modules, among them the
engine, the options, the definitions import and each queue's run, climbing back up 4 times
(found by the same walker on the commit before this one).
"""

from __future__ import annotations

import textwrap

from support.walks import Walker, climbs, load_tree, modules_of


def test_the_restore_walk_is_short_and_only_goes_down():
    steps = Walker().walk("rbak.restore.engine", "run_restore", "storage")
    mods = modules_of(steps)
    assert len(mods) <= 8, mods
    assert climbs(steps) == []
    # of the restore package only the engine (which opens the source) and the source see storage
    assert [m for m in mods if m.startswith("rbak.restore.")] == ["rbak.restore.engine", "rbak.restore.source"]
    # and the walk reaches what restore reads through it: manifests, keys, segments
    assert {"rbak.repo.catalog", "rbak.sealing.envelope", "rbak.format.reader"} <= set(mods)


def test_the_walk_sees_a_climb_and_a_stored_value(tmp_path):
    files = {
        "rbak/__init__.py": "",
        "rbak/restore/__init__.py": "",
        "rbak/restore/engine.py": """
            from ..repo.catalog import load
            from .plan import plan
            from .holder import Holder

            def run(storage, options):
                m = load(storage, "b1")
                plan(options, storage=storage)
                Holder(storage)
        """,
        "rbak/restore/plan.py": "def plan(options, storage):\n    return storage\n",
        "rbak/restore/holder.py": """
            from ..format.reader import read

            class Holder:
                def __init__(self, storage):
                    self._s = storage

                def records(self):
                    return read(self._s)
        """,
        "rbak/repo/__init__.py": "",
        "rbak/repo/catalog.py": "def load(storage, bid):\n    return storage.get(bid)\n",
        "rbak/format/__init__.py": "",
        "rbak/format/reader.py": "def read(where):\n    return where.get('k')\n",
    }
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    steps = Walker(load_tree(tmp_path)).walk("rbak.restore.engine", "run", "storage")
    assert [(s.module, s.function, s.param) for s in steps] == [
        ("rbak.restore.engine", "run", "storage"),
        ("rbak.repo.catalog", "load", "storage"),
        ("rbak.restore.plan", "plan", "storage"),  # by keyword
        ("rbak.restore.holder", "Holder.__init__", "storage"),
        ("rbak.restore.holder", "Holder.records", "self._s"),  # stored on the object, used by a method
        ("rbak.format.reader", "read", "where"),
    ]
    assert climbs(steps) == [("rbak.repo.catalog", "rbak.restore.plan")]
