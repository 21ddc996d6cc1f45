"""Build `.dvc/plots/offline.html`, the page template `dvc plots show` fills, with vega inlined.

    python scripts/build_plots_template.py   # needs npm and the npm registry, nothing else

dvc-render's default page loads vega, vega-lite and vega-embed from a CDN
(`VegaRenderer.SCRIPTS`), so without network every interactive chart stays
empty. `.dvc/config` points `plots.html_template` at the page written here: it
carries the three released minified builds inline and has no `{scripts}`
placeholder, so dvc's CDN tags never enter the page. Inlined rather than
linked because the output folder (`dvc_plots/` or any `-o`) can be anywhere.
"""

import hashlib
import subprocess
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".dvc" / "plots" / "offline.html"

# (package, version, file in the tarball). The newest releases of the major
# versions dvc-render 1.0.2 asks for (vega 5, vega-lite 5, vega-embed 6); its
# pinned ones (5.20.2, 5.2.0, 6.18.2) predate fixes to vega's expression
# sandbox. Order matters: vega-lite needs vega, vega-embed needs both.
PACKAGES = [
    ("vega", "5.33.1", "package/build/vega.min.js"),
    ("vega-lite", "5.23.0", "package/build/vega-lite.min.js"),
    ("vega-embed", "6.29.0", "package/build/vega-embed.min.js"),
]

# dvc-render substitutes {plot_divs} and {refresh_tag}; {scripts} is left
# out on purpose (see the docstring). str.replace is used, not str.format, so
# the braces in the inlined JavaScript are safe.
PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
{refresh_tag}
<title>gpt-benchlab plots</title>
<!-- Built by scripts/build_plots_template.py; licenses in .dvc/plots/LICENSES/. -->
@SCRIPTS@
<style>
  body { font-family: sans-serif; margin: 16px; }
  body > div { margin-bottom: 24px; }
  table { border-spacing: 15px; }
</style>
</head>
<body>
<h1>gpt-benchlab plots</h1>
<p>Drawn offline: vega, vega-lite and vega-embed are inlined in this page.</p>
{plot_divs}
</body>
</html>
"""


def released_build(tarball: Path, member: str) -> str:
    """The minified build inside an npm tarball, without its source-map comment (the map is not shipped)."""
    with tarfile.open(tarball) as tar:
        extracted = tar.extractfile(member)
        assert extracted is not None, f"{member} missing from {tarball.name}"
        text = extracted.read().decode("utf-8")
    lines = text.rstrip("\n").split("\n")
    if lines[-1].startswith("//# sourceMappingURL="):
        lines.pop()
    code = "\n".join(lines)
    # A literal "</script" would end the inline element early; the builds have none.
    assert "</script" not in code.lower(), f"{member} cannot be inlined as is"
    return code


def script_tag(name: str, version: str, tarball: Path, code: str) -> str:
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    return f"<!-- {name}@{version}, BSD-3-Clause, npm tarball sha256 {digest} -->\n<script>\n{code}\n</script>"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        specs = [f"{name}@{version}" for name, version, _ in PACKAGES]
        subprocess.run(["npm", "pack", "--silent", *specs], cwd=tmp, check=True, stdout=subprocess.DEVNULL)
        tags = []
        for name, version, member in PACKAGES:
            tarball = Path(tmp) / f"{name}-{version}.tgz"
            tags.append(script_tag(name, version, tarball, released_build(tarball, member)))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(PAGE.replace("@SCRIPTS@", "\n".join(tags)), encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)} ({OUT.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
