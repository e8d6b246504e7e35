"""Import a bundle of Superset assets, overwriting what exists (run by Superset's own Python).

`superset import-dashboards` leaves databases, datasets and charts that already exist
untouched (it overwrites dashboards only), so a changed chart in the bundle would never reach
an initialised Superset. The assets importer Superset's API uses (`ImportAssetsCommand`)
overwrites every object by UUID: importing the same bundle again changes nothing, importing a
changed one updates in place. Then the roles and row-level security of the `jobs` read policy
are brought up to date (jobscope_access.py), idempotently too.

Usage: python import_assets.py BUNDLE.zip USERNAME
"""

from __future__ import annotations

import sys
from zipfile import ZipFile


def main(bundle_path: str, username: str) -> int:
    from flask import g
    from jobscope_access import ensure_roles_and_rls
    from superset.app import create_app

    from superset import security_manager

    app = create_app()
    with app.app_context():
        from superset.commands.importers.v1.assets import ImportAssetsCommand
        from superset.commands.importers.v1.utils import get_contents_from_bundle

        g.user = security_manager.find_user(username=username)
        if g.user is None:
            print(f"no Superset user {username!r}", file=sys.stderr)
            return 1
        with ZipFile(bundle_path) as bundle:
            contents = get_contents_from_bundle(bundle)
        ImportAssetsCommand(contents).run()
        ensure_roles_and_rls()
    print(f"imported {len(contents)} files from {bundle_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
