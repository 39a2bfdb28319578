package ledger

import (
	"fmt"

	"github.com/rationhq/ration"
)

// Record is one stored record, encoded: a key's state or a spender's
// exactly-once session. A store writes the records a command changed
// (State.AppendRecords) as a batch, DecodeRecords reads a batch, and
// State.Load puts a record back into a state.
type Record struct {
	Session bool   // a spender's session (Name is its id); false: a key's state
	Name    string // the key or the spender id
	Value   []byte // the encoded record; nil: the record was deleted
}

// Batch operations: the format of a journal entry and of a snapshot.
const (
	opKeyPut byte = iota + 1
	opKeyDelete
	opSessionPut
	opSessionDelete
)

// AppendRecords appends recs to b as a batch: per record, an operation
// byte, the name and, for a put, the value, both length-prefixed. Replaying
// a batch in order (last record of a name wins) gives the state it was
// written from.
func AppendRecords(b []byte, recs []Record) []byte {
	e := enc{b: b}
	for _, r := range recs {
		switch {
		case r.Session && r.Value == nil:
			e.put(opSessionDelete, r.Name, nil)
		case r.Session:
			e.put(opSessionPut, r.Name, r.Value)
		case r.Value == nil:
			e.put(opKeyDelete, r.Name, nil)
		default:
			e.put(opKeyPut, r.Name, r.Value)
		}
	}
	return e.b
}

// put appends one batch entry: op, name and, for a put, the value.
func (e *enc) put(op byte, name string, value []byte) {
	e.byte(op)
	e.str(name)
	if op == opKeyPut || op == opSessionPut {
		e.u(uint64(len(value)))
		e.b = append(e.b, value...)
	}
}

// DecodeRecords calls f with each record of the batch b, in order. The
// values alias b. A malformed batch is an error (after f has seen the
// records before the damage).
func DecodeRecords(b []byte, f func(Record) error) error {
	return RangeRecords(b, func(session bool, name, value []byte) error {
		return f(Record{Session: session, Name: string(name), Value: value})
	})
}

// RangeRecords is DecodeRecords without a string per record: f gets each
// record's name as bytes aliasing b too (a journal replay looks up many
// versions of few records).
func RangeRecords(b []byte, f func(session bool, name, value []byte) error) error {
	d := &dec{b: b}
	for len(d.b) > 0 && d.err == nil {
		op := d.byte()
		name := d.bytes(max(ration.MaxKeyLen, ration.MaxSpenderIDLen))
		var session bool
		var value []byte
		switch op {
		case opKeyPut, opSessionPut:
			session = op == opSessionPut
			m := d.u()
			if m == 0 || m > uint64(len(d.b)) {
				d.fail()
				break
			}
			value, d.b = d.b[:m:m], d.b[m:]
		case opKeyDelete, opSessionDelete:
			session = op == opSessionDelete
		default:
			d.fail()
		}
		if d.err != nil {
			break
		}
		if err := f(session, name, value); err != nil {
			return err
		}
	}
	if d.err != nil {
		return fmt.Errorf("allocator: record batch: %w", d.err)
	}
	return nil
}
