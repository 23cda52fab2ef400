"""Chapter 5's exercise, solved: one owner per matrix, in plain torch.distributed.

    python scripts/from_scratch.py --dp 3 --code scripts/from_scratch_owner.py --class OwnerMuon --layout owner

``from_scratch.py --code`` runs this file after its listing, in the listing's namespace, so the class below
subclasses the listing's ``FromScratchMuon`` and changes only its ``orthogonalise`` (stages 3-6): instead
of gathering every matrix on every rank, each rank sends its part of each matrix to that matrix's owner
with one ``all_to_all_single``, the owner runs Newton-Schulz once, and a second ``all_to_all_single``
brings every part of the result back. It is written for data parallelism alone (``tp = 1``); with TP, a
matrix's TP slices would travel to the owner too, as in muongrid's ``layout="owner"``
(``muongrid/owner_flow.py``). Chapter 5 runs the command above on 2 x 1 and 3 x 1 and checks that it
equals muongrid's ``DistributedMuon(layout="owner")`` bit for bit: the owner does the same arithmetic on
the same numbers as every rank of the bucket layout, whoever the owner is.
"""
# ruff: noqa: F821  (FromScratchMuon, dist, torch and zeropower_ns5 are the listing's)


# BOOK-START owner
class OwnerMuon(FromScratchMuon):
    """Stages 3-6 with one owner per matrix (chapter 8's layout), over DP (tp = 1)."""

    def orthogonalise(self, update):
        dp, me, n, lo = self.dp, dist.get_rank(), len(self.params), self.lo
        if self.tp != 1:
            raise ValueError("OwnerMuon is written for tp = 1; run it with --tp 1")
        owner = [i % dp for i in range(n)]   # any rule that every rank computes alike

        def part(rank, i):   # rank's part of matrix i: [a, b) of the flat buffer
            o, start = self.offsets[i], rank * self.shard
            a = max(o, start)
            return a, max(a, min(o + self.params[i].numel(), start + self.shard))

        def size(rank, i):
            a, b = part(rank, i)
            return b - a

        def cat(pieces):   # starting empty: a rank may own no matrix
            return torch.cat([update[:0], *pieces])

        owned = [i for i in range(n) if owner[i] == me]   # the matrices I orthogonalise
        by_owner = sorted(range(n), key=lambda i: owner[i])   # the order I send in
        to = [sum(size(me, i) for i in range(n) if owner[i] == q) for q in range(dp)]
        come = [sum(size(r, i) for i in owned) for r in range(dp)]   # from each rank
        # 3. my part of every matrix to its owner, in one all-to-all (bf16)
        send = cat(update[a - lo: b - lo] for a, b in (part(me, i) for i in by_owner))
        got = update.new_empty(sum(come))
        dist.all_to_all_single(got, send, come, to)
        # 4-5. each matrix I own, whole (its parts arrive in rank order), orthogonalised
        parts = got.split([size(r, i) for r in range(dp) for i in owned])
        done = [zeropower_ns5(torch.cat(parts[k::len(owned)]).view(self.shapes[i]))
                for k, i in enumerate(owned)]
        # 6. each rank's part of every result back to it, in a second all-to-all (bf16)
        back = cat(d.reshape(-1)[a - self.offsets[i]: b - self.offsets[i]]
                   for r in range(dp) for d, i in zip(done, owned)
                   for a, b in [part(r, i)])
        mine = update.new_empty(send.numel())
        dist.all_to_all_single(mine, back, to, come)
        for i, piece in zip(by_owner, mine.split([size(me, i) for i in by_owner])):
            if piece.numel():
                yield i, piece
# BOOK-END owner
