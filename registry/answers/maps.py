"""A 2-D map of the model embeddings (`registry map`): PCA up to PCA_MAX models, t-SNE past them; one colour per
family with a legend; every point labelled, labels nudged apart so they stay legible. The home page's map places its
labels here too (`place_labels`): none overlaps another, and one that finds no room is left to the dot's tooltip.

Why PCA for a registry of a few dozen models: their embeddings spread mostly along one direction (on MMLU-Pro's 31
models the first principal axis holds 98% of the variance, and tracks overall accuracy), and t-SNE drew them as a
near-straight diagonal (99.4% of the drawn spread along one direction). PCA puts that direction on x and the next on
y, each axis scaled to the plot (60% of the drawn spread on the first direction): the differences between models of
like accuracy show, and the axis labels say each axis's share. Its 2-D distances track the 128-d ones (Pearson 1.00
there; t-SNE's 0.94).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from registry.answers.geometry import Pool
from registry.core.errors import InputError

PCA_MAX = 100         # up to this many models, PCA (see the module docstring); past it t-SNE's neighbourhoods
LABEL_MAX = 300       # past this many models, labels would be a solid block: points only


@dataclass
class MapResult:
    out: str
    method: str
    models: int
    families: int
    axis_shares: list[float] | None = None     # PCA: the share of the embeddings' variance along each axis


def principal_axes(vectors: np.ndarray) -> np.ndarray:
    """[n, 2] the vectors on their first two principal axes: the centred rows' SVD in numpy (sklearn's PCA gives the
    same, up to each axis's sign, after a 2 s import), each axis turned so that its largest loading is positive."""
    x = np.asarray(vectors, dtype=np.float64)
    x = x - x.mean(axis=0)
    axes = np.linalg.svd(x, full_matrices=False)[2][:2]                                  # [<=2, D]
    axes *= np.where(axes[np.arange(len(axes)), np.abs(axes).argmax(axis=1)] < 0, -1.0, 1.0)[:, None]
    out = np.zeros((len(x), 2))
    out[:, :len(axes)] = x @ axes.T
    return out


def project(vectors: np.ndarray, seed: int = 0) -> tuple[np.ndarray, str]:
    if len(vectors) < 2:
        return np.zeros((len(vectors), 2)), "single point"
    if len(vectors) <= PCA_MAX:
        return principal_axes(vectors), "pca"
    from sklearn.manifold import TSNE

    perplexity = float(min(30, max(2, (len(vectors) - 1) // 3)))
    # exact gradients for registry-sized inputs: Barnes-Hut's OpenMP threads are far slower on a few dozen points
    exact = "exact" if len(vectors) <= 300 else "barnes_hut"      # exact t-SNE of 1,000 points: ~40 s
    xy = TSNE(n_components=2, perplexity=perplexity, init="pca", method=exact,
              random_state=seed).fit_transform(vectors)
    return xy, "t-sne"


def _spread_labels(ax, texts, points, steps: int = 150) -> None:
    """Push overlapping label boxes apart (and off the points), in display space; a few hundred cheap steps."""
    fig = ax.figure
    fig.canvas.draw()
    inv = ax.transData.inverted()
    pts = ax.transData.transform(points)
    pos = np.array([ax.transData.transform(t.get_position()) for t in texts])
    size = np.array([[b.width, b.height] for b in (t.get_window_extent() for t in texts)])
    for _ in range(steps):
        moved = False
        for i in range(len(texts)):
            d = pos[i] - pos                                  # label-label overlaps
            over = ((np.abs(d[:, 0]) < (size[i, 0] + size[:, 0]) / 2 + 2)
                    & (np.abs(d[:, 1]) < (size[i, 1] + size[:, 1]) / 2 + 1))
            over[i] = False
            dp = pos[i] - pts                                 # labels sitting on someone else's point
            hit = (np.abs(dp[:, 0]) < size[i, 0] / 2 + 3) & (np.abs(dp[:, 1]) < size[i, 1] / 2 + 3)
            hit[i] = False
            push = np.zeros(2)
            if over.any():
                push += np.sign(d[over] + 1e-3).sum(0) * np.array([0.5, 1.5])
            if hit.any():
                push += np.sign(dp[hit] + 1e-3).sum(0) * np.array([0.5, 1.0])
            if push.any():
                pos[i] += push
                moved = True
        if not moved:
            break
    for t, p, pt in zip(texts, pos, pts):
        x, y = inv.transform(p)
        t.set_position((x, y))
        if np.hypot(*(p - pt)) > 14:                         # a label pushed away gets a thin leader line
            px, py = inv.transform(pt)
            ax.plot([px, x], [py, y], color="0.6", lw=0.5, zorder=1)


# A label's width in em by character class: a generous estimate of a sans-serif's advances; the page draws each
# label at exactly this width (SVG textLength), so the boxes placed here are the boxes drawn, whatever the font.
_NARROW, _WIDE = set("iljtfrI.,:;'|!()[] "), set("mwMW@")
LABEL_FONT = 13          # px, the home page's labels
LABEL_GAP = 2            # px kept clear around each label


def label_width(name: str, font: float = LABEL_FONT) -> float:
    em = sum(0.32 if c in _NARROW else 0.86 if c in _WIDE else 0.68 if c.isupper() else 0.56 for c in name)
    return round(em * font, 1)


def label_box(x: float, y: float, anchor: str, width: float, font: float = LABEL_FONT) -> tuple[float, ...]:
    """(left, top, right, bottom) of a label drawn at (x, y) (its baseline) with SVG's text-anchor `anchor`."""
    left = x - {"start": 0.0, "middle": width / 2, "end": width}[anchor]
    return left, y - 0.8 * font, left + width, y + 0.25 * font


def boxes_overlap(a: tuple[float, ...], b: tuple[float, ...], gap: float = 0.0) -> bool:
    return a[0] < b[2] + gap and b[0] < a[2] + gap and a[1] < b[3] + gap and b[1] < a[3] + gap


def place_labels(points: list[dict], *, radius: float = 7, size: tuple[float, float] = (1000, 600),
                 font: float = LABEL_FONT) -> list[dict]:
    """Each point ({name, x, y}) given a `label` ({x, y, anchor, width}) where one fits, else None (its name stays in
    the dot's tooltip): greedy, the least crowded points first, each label at the first of eight spots around its
    dot that stays on the map and clear of every dot and of the labels placed before it. No two labels overlap."""
    dots = [(p["x"] - radius, p["y"] - radius, p["x"] + radius, p["y"] + radius) for p in points]
    xy = np.array([[p["x"], p["y"]] for p in points], dtype=float).reshape(-1, 2)
    crowd = (np.hypot(*(xy[:, None, :] - xy[None, :, :]).transpose(2, 0, 1)) < 80).sum(1)
    placed: list[tuple[float, ...]] = []
    out = [dict(p, label=None) for p in points]
    near, lift = radius + 3, 0.3 * font
    for i in sorted(range(len(points)), key=lambda i: (crowd[i], points[i]["name"])):
        x, y, width = points[i]["x"], points[i]["y"], label_width(points[i]["name"], font)
        spots = [(x + near, y + lift, "start"), (x - near, y + lift, "end"), (x, y - near, "middle"),
                 (x, y + near + 0.8 * font, "middle"), (x + near - 2, y - near + 2, "start"),
                 (x - near + 2, y - near + 2, "end"), (x + near - 2, y + near + 0.6 * font, "start"),
                 (x - near + 2, y + near + 0.6 * font, "end")]
        for sx, sy, anchor in spots:
            box = label_box(sx, sy, anchor, width, font)
            if box[0] < 0 or box[1] < 0 or box[2] > size[0] or box[3] > size[1]:
                continue
            if any(boxes_overlap(box, b, LABEL_GAP) for b in placed) or any(
                    boxes_overlap(box, d) for j, d in enumerate(dots) if j != i):
                continue
            placed.append(box)
            out[i]["label"] = {"x": round(sx, 1), "y": round(sy, 1), "anchor": anchor, "width": width}
            break
    return out


# 14 of Kelly's 22 colours of maximum contrast (K. L. Kelly, "Twenty-two colors of maximum contrast", 1965): white and
# black left out, and of each pair of near hues (two purples, three oranges, two yellows, two pinks) one kept; the
# olive brown (#654522, hard to tell from the reddish brown and the dark olive) replaced by a teal none of them is.
PALETTE = ["#F3C300", "#875692", "#F38400", "#A1CAF1", "#BE0032", "#C2B280", "#848482", "#008856", "#E68FAC",
           "#0067A5", "#882D17", "#8DB600", "#2B3D26", "#00A5A5"]
GOLDEN = 0.6180339887     # hue step between the colours past the palette: each new hue far from the ones before


def family_colours(families) -> dict[str, str]:
    """A distinct colour per family, that does not change as other families come and go: each family's slot in
    PALETTE comes from a hash of its name; a family whose slot is taken takes the next free one (families claim
    slots in hash order, so only families that collide can move). Past 14 families, the others get a hue from the
    hash of their name, moved on by the golden ratio until it is far from the hues given so far and its colour is
    one no other family has."""
    import colorsys
    import hashlib

    def key(f: str) -> int:
        return int(hashlib.sha256(f.encode("utf-8")).hexdigest()[:12], 16)

    names = sorted(set(families), key=lambda f: (key(f), f))
    out: dict[str, str] = {}
    taken: set[int] = set()
    hues: list[float] = []
    extra = max(0, len(names) - len(PALETTE))
    for f in names:
        if len(taken) < len(PALETTE):
            slot = key(f) % len(PALETTE)
            while slot in taken:
                slot = (slot + 1) % len(PALETTE)
            taken.add(slot)
            out[f] = PALETTE[slot]
            continue
        hue, gap = (key(f) % 3600) / 3600, 0.5 / max(extra, 1)
        for _ in range(64):
            if all(min(abs(hue - h), 1 - abs(hue - h)) >= gap for h in hues):
                break
            hue = (hue + GOLDEN) % 1.0
        sat, val = (0.55, 0.85), (0.8, 0.6)            # two tones, by the name's hash: neighbours in hue differ more
        tone = (key(f) >> 13) % 2
        while True:
            r, g, b = colorsys.hsv_to_rgb(hue, sat[tone], val[tone])
            colour = f"#{round(r * 255):02X}{round(g * 255):02X}{round(b * 255):02X}"
            if colour not in out.values():
                break
            hue = (hue + 1 / 3600) % 1.0
        hues.append(hue)
        out[f] = colour
    return out


def render(p: Pool, families: dict[str, str | None], out: str | Path, seed: int = 0,
           title: str | None = None) -> MapResult:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not len(p.names):
        raise InputError("the registry has no embedded models to map")
    out = Path(out)
    if out.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise InputError(f"--out must end in .png, .svg or .pdf, got {out.name!r}")
    xy, method = project(p.vectors, seed)
    fam = [families.get(n) or "(unknown)" for n in p.names]
    kinds = sorted(set(fam))
    colour = family_colours(kinds)
    fig, ax = plt.subplots(figsize=(12, 9), dpi=130)
    for f in kinds:
        sel = [i for i, x in enumerate(fam) if x == f]
        ax.scatter(xy[sel, 0], xy[sel, 1], s=70, color=colour[f], edgecolor="white", linewidth=0.8, label=f, zorder=3)
    pad = 0.08 * (np.ptp(xy, axis=0) + 1e-9)
    ax.set_xlim(xy[:, 0].min() - pad[0], xy[:, 0].max() + pad[0])
    ax.set_ylim(xy[:, 1].min() - pad[1], xy[:, 1].max() + pad[1])
    if len(p.names) <= LABEL_MAX:
        offset = 0.018 * np.ptp(xy[:, 1]) if np.ptp(xy[:, 1]) else 0.1
        texts = [ax.text(x, y + offset, n, fontsize=8, ha="center", va="bottom", zorder=4,
                         bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.75))
                 for (x, y), n in zip(xy, p.names)]
        _spread_labels(ax, texts, xy)
    ax.legend(title="family", loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize=9)
    shares = None
    if method == "pca":   # each axis scaled to the plot: say how much of the spread each holds
        total = float(np.var(p.vectors.astype(np.float64), axis=0).sum()) or 1.0
        shares = [round(float(v) / total, 4) for v in np.var(xy, axis=0)]
        ax.set_xlabel(f"first principal axis: {shares[0]:.1%} of the variance", fontsize=9)
        ax.set_ylabel(f"second principal axis: {shares[1]:.1%} (stretched to the plot)", fontsize=9)
    shown = {"t-sne": "t-SNE", "pca": "PCA"}.get(method, method)
    ax.set_title(title or f"Model embeddings ({shown}, {len(p.names)} models)", fontsize=12)
    ax.set_xticks([]), ax.set_yticks([])
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.text(0.0, -0.03, "Nearby models answer the same questions right and wrong; axes have no units.",
            transform=ax.transAxes, fontsize=8, color="0.4")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)
    return MapResult(str(out), method, len(p.names), len(kinds), shares)
