package allocator

import "github.com/rationhq/ration/bucket"

// callKind names the method of a call, for exactly-once checks.
type callKind uint8

const (
	kindAcquire callKind = iota + 1
	kindReserve
	kindRelease
)

// session is a spender's exactly-once record: its latest epoch, the latest
// sequence applied in it, that call's digest and its stored reply.
type session struct {
	id       string // the spender id, shared by the spender's holdings (one copy, compared by pointer first)
	epoch    uint64
	seq      uint64 // 0: no call applied in this epoch yet
	digest   digest
	kind     callKind
	released bool           // Release closed the epoch
	reply    any            // *AcquireReply, *ReserveReply or *ReleaseReply
	seen     bucket.Instant // the latest call, for retention
	mark     uint64         // store: log position of the latest change (0 = none)

	// noSnapshots: reply was read back from disk without its snapshots
	// (record version 2); they are recomputed before it is first sent.
	noSnapshots bool

	// keys caches the states of the keys of the spender's latest Acquire,
	// in request order: a spender asks for the same keys call after call,
	// and following a pointer the call verifies (same name, not gone) costs
	// fewer cache misses than a lookup in a map of many keys. Entries may
	// be stale or nil; they are hints only. Not stored.
	keys []*keyState

	// acquireReply is the buffer of the spender's Acquire replies: reply
	// points to it after an Acquire, and the next Acquire rewrites it.
	acquireReply *AcquireReply
}

// check decides what to do with call c of kind k and digest d on session s
// (nil: unknown spender). It returns the stored reply for a retry, an
// error for a stale or conflicting call, or (nil, nil) to apply the call.
func (s *session) check(c Caller, k callKind, d digest) (any, error) {
	if s == nil || c.Epoch > s.epoch {
		return nil, nil
	}
	if c.Epoch < s.epoch {
		return nil, ErrStaleEpoch
	}
	switch {
	case c.Sequence < s.seq:
		return nil, ErrStaleSequence
	case c.Sequence == s.seq:
		if s.kind != k || s.digest != d {
			return nil, ErrSequenceReused
		}
		return s.reply, nil
	case s.released:
		return nil, ErrEpochReleased
	}
	return nil, nil
}
