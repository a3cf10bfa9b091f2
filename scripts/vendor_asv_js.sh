#!/usr/bin/env bash
# Re-creates src/paracheck/report/_www/ (the JavaScript and CSS that asv's history pages load from
# CDNs) from the npm registry with `npm pack`, and checks every file against MANIFEST.json.
# Run it after upgrading asv if `paracheck report` names a script it does not vendor.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
www="$root/src/paracheck/report/_www"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
python3 - "$www/MANIFEST.json" > packages.txt <<'PY'
import json, sys
print("\n".join(sorted({f["npm"] for f in json.load(open(sys.argv[1]))["files"]})))
PY
while read -r pkg; do
    npm pack --silent "$pkg" > /dev/null
    mkdir -p "x/$pkg" && tar xzf "$(ls -t *.tgz | head -1)" -C "x/$pkg" && rm -f ./*.tgz
done < packages.txt
python3 - "$www" <<'PY'
import hashlib, json, os, shutil, sys
www = sys.argv[1]
manifest = json.load(open(os.path.join(www, "MANIFEST.json")))
licenses = []
for f in manifest["files"]:
    src = os.path.join("x", f["npm"], "package", f["path_in_package"])
    digest = hashlib.sha256(open(src, "rb").read()).hexdigest()
    if digest != f["sha256"]:
        sys.exit(f"{f['npm']}/{f['path_in_package']}: sha256 {digest} differs from MANIFEST.json's {f['sha256']}")
    shutil.copyfile(src, os.path.join(www, f["file"]))
for pkg in sorted({f["npm"] for f in manifest["files"]}):
    d = os.path.join("x", pkg, "package")
    names = sorted(os.listdir(d))
    lic = next((n for n in names if n.upper().startswith(("LICEN", "MIT"))), None)
    if lic is None:  # flot-orderbars ships none; its package.json declares the licence
        declared = json.load(open(os.path.join(d, "package.json"))).get("license")
        licenses.append(f"===== {pkg} (npm) =====\nNo licence file in the package; package.json declares: {declared}\n")
    else:
        licenses.append(f"===== {pkg} (npm) =====\n" + open(os.path.join(d, lic)).read())
open(os.path.join(www, "LICENSES.txt"), "w").write("\n\n".join(licenses) + "\n")
print(f"{len(manifest['files'])} files verified and copied to {www}")
PY
