package ledger

import (
	"errors"
	"fmt"
	"math"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// Command encoding, for a replicated log: replicas that decode the same
// bytes apply the same command. The format starts with its version byte,
// then the command's kind byte and its Now; integers are varints (the
// record codec's enc and dec).
//
// The encoding is exact for every value of every field, valid or not
// (negative amounts, limits out of range, a zero epoch): Apply validates a
// decoded command the way it validates any other, the same way on every
// replica. Only the lengths the decoder bounds are refused at encoding
// (a key over ration.MaxKeyLen bytes, a spender id over
// ration.MaxSpenderIDLen, more than ration.MaxBatch keys), so that nothing
// encoded fails to decode; Apply would refuse those commands anyway. An
// empty key list decodes as nil. Version 2 added the caller's credential;
// a version 1 command decodes with none.
const commandVersion = 2

// Command kinds, the byte after the version.
const (
	cmdAcquire byte = iota + 1
	cmdReserve
	cmdRelease
	cmdSweep
)

// errBadCommand is wrapped by every DecodeCommand error.
var errBadCommand = errors.New("malformed command")

// EncodeCommand returns cmd (Acquire, ReserveAhead, Release or Sweep, as
// values) encoded. It returns an error wrapping ErrInvalidArgument for a
// length the decoder would refuse, and an error for another type.
func EncodeCommand(cmd Command) ([]byte, error) {
	e := enc{b: make([]byte, 0, 64)}
	e.byte(commandVersion)
	switch c := cmd.(type) {
	case Acquire:
		if err := e.keyedHead(cmdAcquire, c.Now, c.Caller, len(c.Keys), func(i int) string { return c.Keys[i].Key }); err != nil {
			return nil, err
		}
		for i := range c.Keys {
			k := &c.Keys[i]
			e.str(k.Key)
			e.limits(k.Limits)
			e.amount(k.Want)
			e.amount(k.Need)
			e.amount(k.SpendRate)
			e.amount(k.Returned)
			e.amount(k.Held)
			e.amount(k.Debt)
			e.amount(k.Demand)
		}
	case ReserveAhead:
		if err := e.keyedHead(cmdReserve, c.Now, c.Caller, len(c.Keys), func(i int) string { return c.Keys[i].Key }); err != nil {
			return nil, err
		}
		for i := range c.Keys {
			k := &c.Keys[i]
			e.str(k.Key)
			e.limits(k.Limits)
			e.amount(k.Cost)
			e.dur(k.MaxWait)
		}
	case Release:
		if err := e.keyedHead(cmdRelease, c.Now, c.Caller, len(c.Keys), func(i int) string { return c.Keys[i].Key }); err != nil {
			return nil, err
		}
		for i := range c.Keys {
			k := &c.Keys[i]
			e.str(k.Key)
			e.limits(k.Limits)
			e.amount(k.Returned)
			e.amount(k.Debt)
		}
	case Sweep:
		e.byte(cmdSweep)
		e.i(int64(c.Now))
		e.u(uint64(c.Part))
		e.u(uint64(c.Parts))
	default:
		return nil, fmt.Errorf("allocator: encode command: unknown command %T", cmd)
	}
	return e.b, nil
}

// encodableKeys refuses the lengths DecodeCommand bounds.
// keyedHead checks a call with keys against the decoder's bounds
// (encodableKeys) and writes what every such command starts with: its
// kind, Now, caller and number of keys.
func (e *enc) keyedHead(kind byte, now bucket.Instant, c Caller, n int, keyAt func(i int) string) error {
	if err := encodableKeys(c, n, keyAt); err != nil {
		return err
	}
	e.byte(kind)
	e.i(int64(now))
	e.caller(c)
	e.u(uint64(n))
	return nil
}

func encodableKeys(c Caller, n int, keyAt func(i int) string) error {
	if len(c.SpenderID) > ration.MaxSpenderIDLen {
		return inputErr("caller.spender_id", "%d bytes, at most %d", len(c.SpenderID), ration.MaxSpenderIDLen)
	}
	if len(c.Credential) > MaxCredentialLen {
		return inputErr("caller.credential", "%d bytes, at most %d", len(c.Credential), MaxCredentialLen)
	}
	if n > ration.MaxBatch {
		return inputErr("keys", "%d entries, at most %d", n, ration.MaxBatch)
	}
	for i := range n {
		if k := keyAt(i); len(k) > ration.MaxKeyLen {
			return inputErr(keyField(i, "key"), "%d bytes, at most %d", len(k), ration.MaxKeyLen)
		}
	}
	return nil
}

func (e *enc) caller(c Caller) {
	e.str(c.SpenderID)
	e.u(c.Epoch)
	e.u(c.Sequence)
	e.str(c.Credential)
}

func (e *enc) limits(l ration.Limits) {
	e.i(l.RPM)
	e.i(l.TPM)
	e.i(l.BurstRequests)
	e.i(l.BurstTokens)
	e.dur(l.Window)
}

// caller reads a command's caller; version 1 had no credential.
func (d *dec) caller(version byte) Caller {
	c := Caller{SpenderID: d.str(ration.MaxSpenderIDLen), Epoch: d.u(), Sequence: d.u()}
	if version >= 2 {
		c.Credential = d.str(MaxCredentialLen)
	}
	return c
}

func (d *dec) limits() ration.Limits {
	return ration.Limits{RPM: d.i(), TPM: d.i(), BurstRequests: d.i(), BurstTokens: d.i(), Window: d.dur()}
}

// anyAmount reads an amount as written, negative or not (dec.amount, for
// records, refuses a negative one; a command carries what it was given).
func (d *dec) anyAmount() ration.Amount { return ration.Amount{Requests: d.i(), Tokens: d.i()} }

// DecodeCommand decodes what EncodeCommand wrote. A malformed, truncated
// or over-long input, trailing bytes, an unknown kind, or another version,
// is an error; it never panics.
func DecodeCommand(b []byte) (Command, error) {
	d := &dec{b: b}
	v := d.byte()
	if d.err == nil && (v == 0 || v > commandVersion) {
		return nil, fmt.Errorf("allocator: command version %d: %w", v, errBadCommand)
	}
	kind := d.byte()
	now := bucket.Instant(d.i())
	var cmd Command
	switch kind {
	case cmdAcquire:
		c := Acquire{Now: now, Caller: d.caller(v)}
		if n := d.count(ration.MaxBatch); n > 0 {
			c.Keys = make([]AcquireKey, n)
			for i := range c.Keys {
				if d.err != nil {
					break
				}
				c.Keys[i] = AcquireKey{Key: d.str(ration.MaxKeyLen), Limits: d.limits(),
					Want: d.anyAmount(), Need: d.anyAmount(), SpendRate: d.anyAmount(), Returned: d.anyAmount(),
					Held: d.anyAmount(), Debt: d.anyAmount(), Demand: d.anyAmount()}
			}
		}
		cmd = c
	case cmdReserve:
		c := ReserveAhead{Now: now, Caller: d.caller(v)}
		if n := d.count(ration.MaxBatch); n > 0 {
			c.Keys = make([]ReserveKey, n)
			for i := range c.Keys {
				if d.err != nil {
					break
				}
				c.Keys[i] = ReserveKey{Key: d.str(ration.MaxKeyLen), Limits: d.limits(), Cost: d.anyAmount(), MaxWait: d.dur()}
			}
		}
		cmd = c
	case cmdRelease:
		c := Release{Now: now, Caller: d.caller(v)}
		if n := d.count(ration.MaxBatch); n > 0 {
			c.Keys = make([]ReleaseKey, n)
			for i := range c.Keys {
				if d.err != nil {
					break
				}
				c.Keys[i] = ReleaseKey{Key: d.str(ration.MaxKeyLen), Limits: d.limits(), Returned: d.anyAmount(), Debt: d.anyAmount()}
			}
		}
		cmd = c
	case cmdSweep:
		c := Sweep{Now: now}
		if v >= 2 {
			part, parts := d.u(), d.u()
			if part > math.MaxUint32 || parts > math.MaxUint32 {
				d.fail()
			}
			c.Part, c.Parts = uint32(part), uint32(parts)
		}
		cmd = c
	default:
		d.fail()
	}
	if err := d.done(); err != nil {
		return nil, fmt.Errorf("allocator: command: %w", errors.Join(errBadCommand, err))
	}
	return cmd, nil
}
