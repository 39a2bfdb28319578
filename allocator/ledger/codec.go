package ledger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// Record formats. Every record starts with its version byte; integers are
// varints. A record that fails to decode or validate is not vouched for:
// its key starts empty (invariant 5), its session is dropped.
//
// A key record is small because the journal writes one per key per call:
//   - limits are written as decimal mantissa and exponent (limits are
//     usually round numbers: 1e12 takes 1 byte, not 6);
//   - a bucket level closer to full than to zero is written as the
//     distance to full (a flag bit per dimension);
//   - instants (refill instants, holding expiries) are differences from
//     the first bucket's refill instant.
//
// A session's stored Acquire or ReserveAhead reply leaves out the per-key
// snapshots (informational; a retry answered from a decoded reply gets
// them recomputed from the key's state, see State.snapshotAt).
const recordVersion = 2

var errCorrupt = errors.New("corrupt record")

// statusHasShare marks, in a stored Acquire reply's status byte, a key
// answer followed by its share and burst (records from before shares never
// have it).
const statusHasShare = 0x80

type enc struct{ b []byte }

func (e *enc) u(v uint64)  { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) i(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *enc) byte(v byte) { e.b = append(e.b, v) }
func (e *enc) str(s string) {
	e.u(uint64(len(s)))
	e.b = append(e.b, s...)
}
func (e *enc) amount(a ration.Amount) { e.i(a.Requests); e.i(a.Tokens) }
func (e *enc) dur(d time.Duration)    { e.i(int64(d)) }

type dec struct {
	b   []byte
	err error
}

func (d *dec) fail() {
	if d.err == nil {
		d.err = errCorrupt
	}
	d.b = nil
}

// ppm reads a share in millionths, at most ration.ShareUnit.
func (d *dec) ppm() uint32 {
	v := d.u()
	if v > ration.ShareUnit {
		d.fail()
		return 0
	}
	return uint32(v)
}

func (d *dec) u() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) i() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) byte() byte {
	if len(d.b) == 0 {
		d.fail()
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *dec) str(max int) string {
	n := d.u()
	if n > uint64(max) || n > uint64(len(d.b)) {
		d.fail()
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// bytes reads a length-prefixed string without copying it.
func (d *dec) bytes(max int) []byte {
	n := d.u()
	if n > uint64(max) || n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
}

func (d *dec) amount() ration.Amount {
	a := ration.Amount{Requests: d.i(), Tokens: d.i()}
	if a.Requests < 0 || a.Tokens < 0 {
		d.fail()
	}
	return a
}

func (d *dec) dur() time.Duration { return time.Duration(d.i()) }

// count reads a list length, refusing one longer than max.
func (d *dec) count(max int) int {
	n := d.u()
	if n > uint64(max) {
		d.fail()
		return 0
	}
	return int(n)
}

func (d *dec) done() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = errCorrupt
	}
	return d.err
}

const (
	flagFresh   = 1 << iota // limits unknown; buckets start empty at emptyFrom
	flagReqFull             // the request level is written as full - level
	flagTokFull             // the token level is written as full - level
	flagWindow              // the limits' window follows them, in seconds (absent: a minute)
	flagShares              // every holding carries its share fields (absent: none has a share or a demand)
	flagOwner               // the credential that created the key follows the flags (absent: none known)
	flagOwed                // every holding carries what it owes (absent: none owes)
)

// MaxCredentialLen bounds Caller.Credential, in bytes.
const MaxCredentialLen = 64

// decimal writes v >= 0 as mantissa<<4 | exponent (v = mantissa * 10^exponent).
func (e *enc) decimal(v int64) {
	var x int
	for v != 0 && v%10 == 0 && x < 15 {
		v /= 10
		x++
	}
	e.u(uint64(v)<<4 | uint64(x))
}

// decimal reads what enc.decimal wrote, refusing a value above max.
func (d *dec) decimal(max int64) int64 {
	u := d.u()
	m, x := u>>4, u&15
	if m > uint64(max) {
		d.fail()
		return 0
	}
	v := int64(m)
	for range x {
		if v > max/10 {
			d.fail()
			return 0
		}
		v *= 10
	}
	return v
}

// fullUnits is b's level when full, in fixed-point units.
func fullUnits(b *bucket.Bucket) int64 { return b.Limit().Capacity * b.Scale() }

// closerToFull reports whether level is written as the distance to full.
func closerToFull(b *bucket.Bucket, level int64) bool {
	return level >= 0 && fullUnits(b)-level < level
}

const maxHoldsPerKey = 1 << 20

// dimState writes a bucket's level (as the distance to full if fromFull)
// and its refill instant relative to base.
func (e *enc) dimState(b *bucket.Bucket, st bucket.State, fromFull bool, base bucket.Instant) {
	if fromFull {
		e.u(uint64(fullUnits(b) - st.Level))
	} else {
		e.i(st.Level)
	}
	e.i(int64(st.Last - base))
}

// appendKey appends k's record to b.
func appendKey(b []byte, k *keyState) []byte {
	e := enc{b: b}
	e.byte(recordVersion)
	if k.fresh {
		e.byte(flagFresh)
		e.i(int64(k.emptyFrom))
		return e.b
	}
	var flags byte
	var rs, ts bucket.State
	if k.req.on {
		if rs = k.req.b.State(); closerToFull(&k.req.b, rs.Level) {
			flags |= flagReqFull
		}
	}
	if k.tok.on {
		if ts = k.tok.b.State(); closerToFull(&k.tok.b, ts.Level) {
			flags |= flagTokFull
		}
	}
	if k.lim.Window != 0 {
		flags |= flagWindow
	}
	for i := range k.holds {
		if h := &k.holds[i]; !h.share.Zero() || h.demand != (ration.Amount{}) {
			flags |= flagShares
		}
		if k.holds[i].owed != (ration.Amount{}) {
			flags |= flagOwed
		}
	}
	if k.owner != nil && k.owner.cred != "" {
		flags |= flagOwner
	}
	e.byte(flags)
	if flags&flagOwner != 0 {
		e.str(k.owner.cred)
	}
	e.decimal(k.lim.RPM)
	e.decimal(k.lim.TPM)
	e.decimal(k.lim.BurstRequests)
	e.decimal(k.lim.BurstTokens)
	if k.lim.Window != 0 {
		e.u(uint64(k.lim.Window / time.Second))
	}
	// base: the first bucket's refill instant (a valid record has a bucket);
	// the other instants are written relative to it (wrapping arithmetic,
	// so exact for any values).
	base := ts.Last
	if k.req.on {
		base = rs.Last
	}
	e.i(int64(base))
	if k.req.on {
		e.dimState(&k.req.b, rs, flags&flagReqFull != 0, base)
	}
	if k.tok.on {
		e.dimState(&k.tok.b, ts, flags&flagTokFull != 0, base)
	}
	e.u(uint64(len(k.holds)))
	for i := range k.holds {
		h := &k.holds[i]
		e.str(h.spender)
		e.u(h.epoch)
		e.u(h.lastSeq)
		e.amount(h.held)
		e.amount(h.rate)
		e.i(int64(h.expiry - base))
		if flags&flagShares != 0 {
			e.amount(h.demand)
			e.u(uint64(h.share.Requests))
			e.u(uint64(h.share.Tokens))
			if !h.share.Zero() {
				e.decimal(h.shareLim.RPM)
				e.decimal(h.shareLim.TPM)
				e.u(uint64(h.shareLim.Window / time.Second))
			}
			e.i(int64(h.shareFrom - base))
			e.amount(h.accrued)
			e.amount(h.growTo)
		}
		if flags&flagOwed != 0 {
			e.amount(h.owed)
		}
	}
	return e.b
}

func decodeKey(b []byte) (*keyState, error) {
	d := &dec{b: b}
	v := d.byte()
	if v != recordVersion {
		return nil, fmt.Errorf("allocator: key record version: %w", errCorrupt)
	}
	k := &keyState{}
	flags := d.byte()
	if flags&flagOwner != 0 {
		// A placeholder State.recount replaces with the credential's usage.
		k.owner = &usage{cred: d.str(MaxCredentialLen)}
	}
	if flags&flagFresh != 0 {
		k.fresh = true
		k.emptyFrom = bucket.Instant(d.i())
		if k.emptyFrom == 0 {
			d.fail()
		}
		return k, d.done()
	}
	k.lim = ration.Limits{RPM: d.decimal(ration.MaxRate), TPM: d.decimal(ration.MaxRate), BurstRequests: d.decimal(ration.MaxRate), BurstTokens: d.decimal(ration.MaxRate)}
	if flags&flagWindow != 0 {
		s := d.u()
		if s == 0 || s > uint64(ration.MaxWindow/time.Second) {
			d.fail()
		}
		k.lim.Window = time.Duration(s) * time.Second
	}
	if d.err != nil {
		return nil, d.err
	}
	if err := validateLimits(0, k.lim); err != nil || (k.lim.RPM == 0 && k.lim.TPM == 0) {
		return nil, fmt.Errorf("allocator: key record limits: %w", errCorrupt)
	}
	base := bucket.Instant(d.i())
	rl, rok := k.lim.RequestLimit()
	tl, tok := k.lim.TokenLimit()
	for _, x := range []struct {
		d        *dim
		lim      bucket.Limit
		on       bool
		fromFull bool
	}{{&k.req, rl, rok, flags&flagReqFull != 0}, {&k.tok, tl, tok, flags&flagTokFull != 0}} {
		lim := x.lim
		if !x.on {
			continue
		}
		var st bucket.State
		if x.fromFull {
			below := d.u()
			full, err := bucket.New(lim, 0) // its level is the full level
			if err != nil || below > uint64(bucket.MaxScaled) {
				return nil, fmt.Errorf("allocator: key record bucket: %w", errCorrupt)
			}
			st.Level = full.State().Level - int64(below)
		} else {
			st.Level = d.i()
		}
		st.Last = bucket.Instant(d.i()) + base
		if d.err != nil {
			return nil, d.err
		}
		b, err := bucket.FromState(lim, st)
		if err != nil {
			return nil, fmt.Errorf("allocator: key record bucket: %w", errors.Join(errCorrupt, err))
		}
		*x.d = dim{on: true, b: b}
	}
	n := d.count(maxHoldsPerKey)
	if n > 0 {
		k.holds = make([]holding, 0, n)
	}
	for i := 0; i < n && d.err == nil; i++ {
		h := holding{spender: d.str(ration.MaxSpenderIDLen), epoch: d.u(), lastSeq: d.u(), held: d.amount(), rate: d.amount(), expiry: bucket.Instant(d.i()) + base}
		if h.spender == "" || h.epoch == 0 {
			d.fail()
		}
		if flags&flagShares != 0 {
			h.demand = d.amount()
			h.share = ration.Share{Requests: d.ppm(), Tokens: d.ppm()}
			if !h.share.Zero() {
				h.shareLim = ration.Limits{RPM: d.decimal(ration.MaxRate), TPM: d.decimal(ration.MaxRate)}
				if w := d.u(); w != 0 {
					if w > uint64(ration.MaxWindow/time.Second) {
						d.fail()
					}
					h.shareLim.Window = time.Duration(w) * time.Second
				}
			}
			h.shareFrom = bucket.Instant(d.i()) + base
			h.accrued, h.growTo = d.amount(), d.amount()
		}
		if flags&flagOwed != 0 {
			h.owed = d.amount()
		}
		k.holds = append(k.holds, h)
	}
	if err := d.done(); err != nil {
		return nil, err
	}
	return k, nil
}

// The flags byte of a session record.
const (
	sessionReleased   = 1 << iota // Release closed the epoch
	sessionCredential             // the credential the session belongs to follows (absent: none)
)

// appendSession appends s's record to b.
func appendSession(b []byte, s *session) []byte {
	e := enc{b: b}
	e.byte(recordVersion)
	e.u(s.epoch)
	e.u(s.seq)
	e.b = binary.LittleEndian.AppendUint64(e.b, uint64(s.digest))
	e.byte(byte(s.kind))
	var flags byte
	if s.released {
		flags |= sessionReleased
	}
	if s.use != nil && s.use.cred != "" {
		flags |= sessionCredential
	}
	e.byte(flags)
	if flags&sessionCredential != 0 {
		e.str(s.use.cred)
	}
	e.i(int64(s.seen))
	switch r := s.reply.(type) {
	case *AcquireReply:
		e.dur(r.LeaseTTL)
		e.u(uint64(len(r.Keys)))
		for i := range r.Keys {
			x := &r.Keys[i]
			st := byte(x.Status)
			if !x.Share.Zero() || !x.ShareFair.Zero() {
				st |= statusHasShare
			}
			e.byte(st)
			e.amount(x.Granted)
			e.amount(x.Returned)
			e.amount(x.Held)
			e.dur(x.RetryAfter)
			e.u(uint64(x.ActiveSpenders))
			if st&statusHasShare != 0 {
				e.u(uint64(x.Share.Requests))
				e.u(uint64(x.Share.Tokens))
				e.amount(x.ShareBurst)
				e.u(uint64(x.ShareFair.Requests))
				e.u(uint64(x.ShareFair.Tokens))
			}
		}
	case *ReserveReply:
		e.dur(r.LeaseTTL)
		e.u(uint64(len(r.Keys)))
		for i := range r.Keys {
			x := &r.Keys[i]
			e.byte(byte(x.Status))
			e.dur(x.Wait)
			e.amount(x.Held)
			e.u(uint64(x.ActiveSpenders))
		}
	case *ReleaseReply:
		e.u(uint64(len(r.Returned)))
		for _, a := range r.Returned {
			e.amount(a)
		}
	}
	return e.b
}

func decodeSession(b []byte) (*session, error) {
	d := &dec{b: b}
	v := d.byte()
	if v != recordVersion {
		return nil, fmt.Errorf("allocator: session record version: %w", errCorrupt)
	}
	s := &session{epoch: d.u(), seq: d.u(), noSnapshots: true}
	if len(d.b) < 8 {
		return nil, errCorrupt
	}
	s.digest = digest(binary.LittleEndian.Uint64(d.b))
	d.b = d.b[8:]
	s.kind = callKind(d.byte())
	flags := d.byte()
	s.released = flags&sessionReleased != 0
	// A placeholder State.recount replaces with the credential's usage.
	s.use = &usage{}
	if flags&sessionCredential != 0 {
		s.use.cred = d.str(MaxCredentialLen)
	}
	if flags&^(sessionReleased|sessionCredential) != 0 {
		d.fail()
	}
	s.seen = bucket.Instant(d.i())
	switch s.kind {
	case kindAcquire:
		r := &AcquireReply{LeaseTTL: d.dur()}
		r.Keys = make([]AcquireResult, d.count(ration.MaxBatch))
		for i := range r.Keys {
			st := d.byte()
			r.Keys[i] = AcquireResult{Status: Status(st &^ statusHasShare), Granted: d.amount(), Returned: d.amount(), Held: d.amount(),
				RetryAfter: d.dur(), ActiveSpenders: int(d.u())}
			if st&statusHasShare != 0 {
				r.Keys[i].Share = ration.Share{Requests: d.ppm(), Tokens: d.ppm()}
				r.Keys[i].ShareBurst = d.amount()
				r.Keys[i].ShareFair = ration.Share{Requests: d.ppm(), Tokens: d.ppm()}
			}
		}
		s.reply = r
	case kindReserve:
		r := &ReserveReply{LeaseTTL: d.dur()}
		r.Keys = make([]ReserveResult, d.count(ration.MaxBatch))
		for i := range r.Keys {
			r.Keys[i] = ReserveResult{Status: Status(d.byte()), Wait: d.dur(), Held: d.amount(), ActiveSpenders: int(d.u())}
		}
		s.reply = r
	case kindRelease:
		r := &ReleaseReply{Returned: make([]ration.Amount, d.count(ration.MaxBatch))}
		for i := range r.Returned {
			r.Returned[i] = d.amount()
		}
		s.reply = r
	default:
		d.fail()
	}
	if s.epoch == 0 || s.seq == 0 {
		d.fail()
	}
	if err := d.done(); err != nil {
		return nil, err
	}
	return s, nil
}
