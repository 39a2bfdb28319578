package ledger

import (
	"fmt"
	"maps"
	"slices"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// Load puts one stored record into the state, for recovery from a store
// or a snapshot; a record with a nil Value deletes it. A key record that
// fails to decode or validate is not vouched for: the key starts with
// empty buckets at now and no holdings (invariant 5), and Load returns the
// error. A session record that fails is forgotten, and Load returns the
// error.
func (s *State) Load(r Record, now bucket.Instant) error {
	s.loaded = true // what each credential keeps is counted again before the next command
	if r.Session {
		if r.Value == nil {
			delete(s.sessions, r.Name)
			return nil
		}
		ss, err := decodeSession(r.Value)
		if err == nil && ration.ValidSpenderID(r.Name) != nil {
			err = fmt.Errorf("allocator: session record: bad spender id: %w", errCorrupt)
		}
		if err != nil {
			delete(s.sessions, r.Name)
			return err
		}
		ss.id = r.Name
		s.sessions[r.Name] = ss
		return nil
	}
	if r.Value == nil {
		delete(s.keys, r.Name)
		return nil
	}
	ks, err := decodeKey(r.Value)
	if err == nil && ration.ValidKey(r.Name) != nil {
		err = fmt.Errorf("allocator: key record: bad key: %w", errCorrupt)
	}
	if err != nil {
		// Empty, and refilling only once every lease granted before the
		// loss has expired: until then the spenders may still spend those
		// leases, which the key's state no longer counts (docs/bound.md).
		ks = &keyState{fresh: true, emptyFrom: now.Add(s.cfg.TTL)}
	}
	ks.hash = nameHash(r.Name)
	s.keys[r.Name] = ks
	return err
}

// Snapshot returns the whole state as a record batch (AppendRecords): the
// keys, then the sessions, each in name order. Equal states give equal
// snapshots, byte for byte.
func (s *State) Snapshot() []byte {
	recs := make([]Record, 0, len(s.keys)+len(s.sessions))
	for _, name := range slices.Sorted(maps.Keys(s.keys)) {
		recs = append(recs, Record{Name: name, Value: appendKey(nil, s.keys[name])})
	}
	for _, id := range slices.Sorted(maps.Keys(s.sessions)) {
		recs = append(recs, Record{Session: true, Name: id, Value: appendSession(nil, s.sessions[id])})
	}
	return AppendRecords(nil, recs)
}

// Restore returns a State with cfg holding the records of the batch b (a
// Snapshot, or journal entries replayed in order). A record that does not
// load is an error.
func Restore(cfg Config, b []byte, now bucket.Instant) (*State, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := DecodeRecords(b, func(r Record) error { return s.Load(r, now) }); err != nil {
		return nil, err
	}
	return s, nil
}
