package allocator

import (
	"context"

	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	bucketKeys     = []byte("keys")
	bucketSessions = []byte("sessions")
	bucketMeta     = []byte("meta")
	metaFormat     = []byte("format")
)

const storeFormat = "ration-allocator/1"

// recID names a stored record: a key's state or a spender's session.
type recID struct {
	session bool
	name    string
}

// store makes a Ledger durable in bbolt. Calls apply in memory, mark the
// records they changed, and wait in sync for a db.Batch commit that writes
// those records' state as of commit time. Because every commit writes the
// whole current state of every record changed so far, what is on disk is
// always the state after some prefix of the applied calls, and a call is
// answered only once a commit covering it has been synced.
//
// All fields but db and obs are guarded by the ledger's mutex.
type store struct {
	db  *bolt.DB
	l   *Ledger
	obs func(time.Duration, error)

	log    []recID          // records in the order they were marked, from position base
	base   uint64           // log position of log[0]; everything before it is durable
	latest map[recID]uint64 // each not-yet-durable record's latest log position
	curTx  *bolt.Tx         // the transaction the last callback wrote in
	curPos uint64           // log position up to which curTx has written
}

func (l *Ledger) markKey(name string) {
	if l.st != nil {
		l.st.mark(recID{name: name})
	}
}

func (l *Ledger) markSession(id string) {
	if l.st != nil {
		l.st.mark(recID{session: true, name: id})
	}
}

func (st *store) mark(id recID) {
	pos := st.base + uint64(len(st.log))
	st.log = append(st.log, id)
	st.latest[id] = pos
}

func (l *Ledger) sync(ctx context.Context) error {
	if l.st == nil {
		return nil
	}
	return l.st.sync(ctx)
}

// sync returns once every record changed before it was called is durable.
// The context is not consulted: a commit cannot be abandoned halfway, and
// bbolt's Batch takes none.
func (st *store) sync(context.Context) error {
	var wrote uint64
	start := time.Now()
	err := st.db.Batch(func(tx *bolt.Tx) error {
		st.l.mu.Lock()
		defer st.l.mu.Unlock()
		if h := st.l.cfg.hook; h != nil {
			if err := h("before"); err != nil {
				return err
			}
		}
		from := st.curPos
		if tx != st.curTx || from < st.base {
			st.curTx, from = tx, st.base
		}
		end := st.base + uint64(len(st.log))
		if err := st.write(tx, from, end); err != nil {
			return err
		}
		st.curPos, wrote = end, end
		return nil
	})
	if st.obs != nil {
		st.obs(time.Since(start), err)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotDurable, err)
	}
	st.l.mu.Lock()
	st.trim(wrote)
	st.l.mu.Unlock()
	return nil
}

// write puts the current state of the records marked at log positions
// [from, end) into tx, each once (at its latest mark).
func (st *store) write(tx *bolt.Tx, from, end uint64) error {
	keys, sessions := tx.Bucket(bucketKeys), tx.Bucket(bucketSessions)
	for pos := from; pos < end; pos++ {
		id := st.log[pos-st.base]
		if st.latest[id] != pos {
			continue // marked again later; written then
		}
		// A fresh buffer per record: bbolt keeps the slices it is given
		// until the transaction ends.
		var e enc
		var err error
		if id.session {
			if s := st.l.sessions[id.name]; s != nil {
				encodeSession(&e, s)
				err = sessions.Put([]byte(id.name), e.b)
			} else {
				err = sessions.Delete([]byte(id.name))
			}
		} else {
			if k := st.l.keys[id.name]; k != nil {
				encodeKey(&e, k)
				err = keys.Put([]byte(id.name), e.b)
			} else {
				err = keys.Delete([]byte(id.name))
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// trim forgets log positions before end: they are durable.
func (st *store) trim(end uint64) {
	if end <= st.base {
		return
	}
	n := end - st.base
	for _, id := range st.log[:n] {
		if p, ok := st.latest[id]; ok && p < end {
			delete(st.latest, id)
		}
	}
	rest := copy(st.log, st.log[n:])
	clear(st.log[rest:])
	st.log = st.log[:rest]
	st.base = end
}

func (st *store) close() error { return st.db.Close() }

// Open returns a durable Ledger stored in the bbolt file at path, creating
// it if needed, and recovers its state: every key and session durably
// written resumes exactly; a record that cannot be decoded or validated is
// not vouched for (its key starts with empty buckets, its session is
// forgotten) and is logged. Open fails if another process holds the file.
func Open(path string, opts ...Option) (*Ledger, error) {
	l, err := New(opts...)
	if err != nil {
		return nil, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("allocator: open store %s: %w", path, err)
	}
	db.NoSync = l.cfg.noSync
	db.MaxBatchSize = l.cfg.maxBatchSize
	db.MaxBatchDelay = l.cfg.maxBatchDelay
	st := &store{db: db, l: l, obs: l.cfg.commitObserver, latest: make(map[recID]uint64)}
	if err := st.recover(); err != nil {
		db.Close()
		return nil, err
	}
	l.st = st
	return l, nil
}

func (st *store) recover() error {
	err := st.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		switch f := meta.Get(metaFormat); {
		case f == nil:
			if err := meta.Put(metaFormat, []byte(storeFormat)); err != nil {
				return err
			}
		case string(f) != storeFormat:
			return fmt.Errorf("allocator: store format %q, want %q", f, storeFormat)
		}
		if _, err := tx.CreateBucketIfNotExists(bucketKeys); err != nil {
			return err
		}
		_, err = tx.CreateBucketIfNotExists(bucketSessions)
		return err
	})
	if err != nil {
		return fmt.Errorf("allocator: prepare store: %w", err)
	}
	l := st.l
	now := l.now()
	lost := 0
	err = st.db.View(func(tx *bolt.Tx) error {
		err := tx.Bucket(bucketKeys).ForEach(func(k, v []byte) error {
			ks, err := decodeKey(v)
			if err != nil || len(k) == 0 || len(k) > MaxKeyLen {
				l.cfg.logger.Warn("allocator: key state not vouched for; it starts empty", "err", err)
				ks = &keyState{fresh: true, emptyFrom: now}
				lost++
			}
			l.keys[string(k)] = ks
			return nil
		})
		if err != nil {
			return err
		}
		return tx.Bucket(bucketSessions).ForEach(func(k, v []byte) error {
			s, err := decodeSession(v)
			if err != nil || len(k) == 0 || len(k) > MaxSpenderIDLen {
				l.cfg.logger.Warn("allocator: session not vouched for; forgotten", "spender", string(k), "err", err)
				lost++
				return nil
			}
			l.sessions[string(k)] = s
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("allocator: recover store: %w", err)
	}
	l.cfg.logger.Info("allocator: store recovered", "keys", len(l.keys), "sessions", len(l.sessions), "not_vouched", lost)
	return nil
}
