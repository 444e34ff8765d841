"""Sampling kernels of the synthetic routing generator (synth.py, step 10): Gumbel noise, row-wise top-k,
and the candidate pool that draws a row's complement experts in order without replacement.

Shapes: n rows (tokens of one chunk), E experts, G expert groups, C contexts; flat (row * E + expert)
indices throughout (np.take on flat arrays measured several times faster than 2-D fancy indexing).
"""

from __future__ import annotations

import numpy as np


def _gumbel(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Standard Gumbel noise, float32 (two in-place float32 logs are the cheapest exact route)."""
    g = rng.random(shape, dtype=np.float32)
    np.maximum(g, np.float32(2.0**-25), out=g)  # rng.random can return 0; keep log finite
    np.log(g, out=g)
    np.negative(g, out=g)
    np.log(g, out=g)
    return np.negative(g, out=g)


def _rowtake(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """x[r, idx[r, j]] for 2-D x and idx (a flat np.take: much cheaper than take_along_axis)."""
    return np.take(x.ravel(), idx + (np.arange(x.shape[0]) * x.shape[1])[:, None])


def _topk_sorted(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Values and column indices of the k largest entries of each row of x (n, m >= k), descending."""
    if x.shape[1] > k:
        idx = np.argpartition(-x, k - 1, axis=1)[:, :k]
    else:
        idx = np.broadcast_to(np.arange(k), x.shape).copy()
    val = _rowtake(x, idx)
    o = np.argsort(-val, axis=1, kind="stable")
    return _rowtake(val, o), _rowtake(idx, o)


class _CandidatePool:
    """Per row, the experts of its complement draws in order. By default i.i.d. draws from the row's
    context base distribution, made in bulk (n, width) and consumed in order: skipping stamped experts and
    experts of unchosen groups turns them into sequential sampling without replacement from the base
    restricted to the chosen groups. A row whose drawable mass gets small switches to an exact list: one
    dense Gumbel-top-k over what is left gives all its remaining draws in order at once."""

    def __init__(self, cfg, rng, c, tb, chosen, width: int) -> None:
        self.cfg, self.rng, self.c, self.tb, self.chosen, self.width = cfg, rng, c, tb, chosen, width
        self.cand = self._draw(np.arange(c.size))
        self.ptr = np.zeros(c.size, np.int64)
        self.exact = np.zeros(c.size, bool)

    def _draw(self, rows: np.ndarray) -> np.ndarray:
        tb, w, E, B = self.tb, self.width, self.cfg.num_experts, self.tb["B"]
        c = np.repeat(self.c[rows], w)
        u = self.rng.random(c.size)
        i = tb["guide"].take(c * B + (u * B).astype(np.int64))
        todo = np.nonzero(tb["cdf"].take(c * E + i) <= u)[0]
        while todo.size:  # guide-table walk, only for the few draws past their bucket's first index
            i[todo] += 1
            todo = todo[tb["cdf"].take(c[todo] * E + i[todo]) <= u[todo]]
        return i.reshape(rows.size, w)

    def _make_exact(self, rows: np.ndarray, stamp: np.ndarray, tag: int) -> None:
        E, G = self.cfg.num_experts, self.cfg.n_group
        lp = self.tb["logp"].reshape(-1, E)[self.c[rows]]
        lp = np.where(stamp.reshape(-1, E)[rows] == tag, -np.inf, lp)
        if G > 1:
            lp[~np.repeat(self.chosen.reshape(-1, G)[rows], E // G, axis=1)] = -np.inf
        k = min(self.cfg.top_k, E)
        self.cand[rows, :k] = _topk_sorted(lp + _gumbel(self.rng, lp.shape), k)[1]
        self.ptr[rows] = 0
        self.exact[rows] = True

    def next_free(self, rows: np.ndarray, free_mass: np.ndarray, stamp: np.ndarray, tag: int) -> np.ndarray:
        """The next draw of each row that is neither stamped nor in an unchosen group.

        free_mass: (rows,) base mass still drawable (the acceptance rate of a pool draw). Rows where it is
        small enough that rejection would cost more than O(E) work switch to an exact list.
        """
        E, w = self.cfg.num_experts, self.width
        switch = ~self.exact[rows] & (free_mass < min(0.5, 16.0 / E))
        if switch.any():
            self._make_exact(rows[switch], stamp, tag)
        out = np.empty(rows.size, np.int64)
        ex = self.exact[rows]
        rr = rows[ex]
        out[ex] = self.cand.ravel().take(rr * w + self.ptr[rr])
        self.ptr[rr] += 1
        todo = np.nonzero(~ex)[0]
        for _ in range(4 * w):
            if todo.size == 0:
                return out
            rr = rows[todo]
            dry = self.ptr[rr] >= w
            if dry.any():
                self.cand[rr[dry]] = self._draw(rr[dry])
                self.ptr[rr[dry]] = 0
            e = self.cand.ravel().take(rr * w + self.ptr[rr])
            self.ptr[rr] += 1
            ok = stamp.take(rr * E + e) != tag
            if self.chosen is not None:
                G = self.cfg.n_group
                ok &= self.chosen.take(rr * G + e // (E // G))
            out[todo[ok]] = e[ok]
            todo = todo[~ok]
        # Still unlucky after many draws: the exact list (its first entry is the next draw).
        self._make_exact(rows[todo], stamp, tag)
        out[todo] = self.cand[rows[todo], 0]
        self.ptr[rows[todo]] = 1
        return out
