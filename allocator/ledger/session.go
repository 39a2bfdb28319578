package ledger

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
	id       string // the spender id; the spender's holdings share this copy
	use      *usage // the credential that created it, which alone may call under its id until it is released
	epoch    uint64
	seq      uint64 // 0: no call applied in this epoch yet
	digest   digest
	kind     callKind
	released bool           // Release closed the epoch
	reply    any            // *AcquireReply, *ReserveReply or *ReleaseReply
	seen     bucket.Instant // the latest call, for retention

	// noSnapshots: reply was decoded from a record, which leaves out the
	// snapshots; they are recomputed when a retry first reads it.
	noSnapshots bool
}

// takes reports whether a call of c may use s's spender id: the session is
// c's credential's, or has none (a record from before credentials, which
// the call then adopts), or was released and c starts a new epoch in it.
func (s *session) takes(c Caller) bool {
	return s.use.cred == c.Credential || s.use.cred == "" || (s.released && c.Epoch > s.epoch)
}

// check decides what to do with call c of kind k and digest d on session s
// (nil: unknown spender). It returns the stored reply for a retry, an
// error for a stale or conflicting call, or (nil, nil) to apply the call.
func (s *session) check(c Caller, k callKind, d digest) (any, error) {
	if s == nil || c.Epoch > s.epoch {
		return nil, nil
	}
	if c.Epoch < s.epoch {
		return nil, &StaleEpochError{Latest: s.epoch}
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
