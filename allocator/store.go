package allocator

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/bucket"
	"github.com/rationhq/ration/internal/boltcheck"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

var (
	bucketKeys     = []byte("keys")
	bucketSessions = []byte("sessions")
	bucketJournal  = []byte("journal")
	bucketMeta     = []byte("meta")
	metaFormat     = []byte("format")
)

// storeFormat names the layout of the store and its record version.
const storeFormat = "ration-allocator/2"

// checkpointBytes is how much journal triggers a checkpoint.
const checkpointBytes = 64 << 20

// journalChunk is the size from which a journal entry's records go into
// another value: a few pages each, so that bbolt writes a commit without
// one huge buffer.
const journalChunk = 15000

// journal is a durable Ledger's store (Open): memory's state, with the
// records each command changes persisted in bbolt. A call appends its
// command's records (in order of application, under memory's mutex) and
// waits until a group commit has made them durable; what is on disk is
// therefore always the state after a prefix of the applied commands.
//
// A commit appends everything appended since the last one as one entry of
// the journal bucket (a few kilobytes in one Put, not one B+tree update
// per record); a checkpoint, run in the background once the journal passes
// checkpointBytes and at Open, replays the journal into the keys and
// sessions buckets and empties it. Records are states, not deltas, and
// entries are keyed by position, so replay is idempotent and ordered: a
// crash at any point leaves a journal that replays to the same state.
type journal struct {
	*memory
	db     *bolt.DB
	obs    func(time.Duration, error)
	hook   func(stage string) error
	logger *slog.Logger
	gc     *groupCommit // commits the journal; its flush is commit

	journalBytes  atomic.Int64   // journal written since the last checkpoint
	checkpointing atomic.Bool    // a checkpoint goroutine is running
	wg            sync.WaitGroup // the checkpoint goroutine

	chunksMu sync.Mutex // guards chunks, spare and appended; add takes it under memory's mutex, commit alone
	chunks   [][]byte   // journal chunks (record batches) appended and not yet taken by a commit
	spare    [][]byte   // empty chunks a commit has written, for add to reuse (at most spareChunks)
	appended uint64     // commands appended so far (with records)
}

// spareChunks bounds the written chunks a journal keeps for reuse: about
// what a commit of 64-key calls under full load writes (some 2 MB), so
// that a steady load allocates no chunks.
const spareChunks = 64

func newJournal(db *bolt.DB, m *memory, cfg config) *journal {
	st := &journal{memory: m, db: db, obs: cfg.commitObserver, hook: cfg.hook, logger: cfg.logger}
	st.gc = newGroupCommit(cfg.linger, st.commit)
	return st
}

// apply applies the command build makes (memory.step) and returns its
// reply once the records it changed, or, for a retry, every change
// applied before it, are durable: the group commit (groupCommit) runs
// commit for the calls that wait together. (bbolt's db.Batch arms a timer
// per batch and queues on the writer lock, so under load many small
// batches each pay an fsync.) If ctx ends during that wait, the call
// stays applied in memory and its records are committed with a later
// call's.
func (st *journal) apply(ctx context.Context, build func(now bucket.Instant) ledger.Command) (any, error) {
	reply, pos, err := st.step(build, st.add)
	if err != nil {
		return nil, err
	}
	if err := st.gc.wait(ctx, pos); err != nil {
		if err == ctx.Err() {
			return nil, &AbandonedError{Err: err, Applied: true}
		}
		return nil, err
	}
	return reply, nil
}

// add appends the records of state that one command changed to the
// journal's next entry, as a record batch; it runs under memory's mutex,
// as the next command changes them. It returns the position to wait for:
// that command's, or, if it changed nothing (a retry), the last one
// appended.
func (st *journal) add(state *ledger.State, changed ledger.Changes) uint64 {
	st.chunksMu.Lock()
	defer st.chunksMu.Unlock()
	if changed.Empty() {
		return st.appended
	}
	if n := len(st.chunks); n == 0 || len(st.chunks[n-1]) >= journalChunk {
		st.chunks = append(st.chunks, st.newChunk())
	}
	last := &st.chunks[len(st.chunks)-1]
	*last = state.AppendRecords(*last, changed)
	st.appended++
	return st.appended
}

// newChunk returns an empty chunk, a spare one if any; chunksMu is held.
func (st *journal) newChunk() []byte {
	if n := len(st.spare); n > 0 {
		c := st.spare[n-1]
		st.spare = st.spare[:n-1]
		return c
	}
	return make([]byte, 0, 2*journalChunk)
}

// commit writes everything appended so far as one journal entry, in one
// bbolt transaction, and returns the last position it covered. On error
// the chunks go back to the front of the queue: the next commit writes
// them.
func (st *journal) commit() (uint64, error) {
	start := time.Now()
	var chunks [][]byte
	var end uint64
	err := st.db.Update(func(tx *bolt.Tx) error {
		if err := st.runHook("before"); err != nil {
			return err
		}
		st.chunksMu.Lock()
		chunks, end = st.chunks, st.appended
		st.chunks = nil
		st.chunksMu.Unlock()
		if err := st.put(tx, end, chunks); err != nil {
			return err
		}
		return st.runHook("after")
	})
	if st.obs != nil {
		st.obs(time.Since(start), err)
	}
	st.chunksMu.Lock()
	if err != nil {
		st.chunks = append(chunks, st.chunks...)
		st.chunksMu.Unlock()
		return 0, fmt.Errorf("%w: %w", ErrNotDurable, err)
	}
	// bbolt has written the chunks and refers to them no more once the
	// transaction has ended.
	for _, c := range chunks {
		if len(st.spare) < spareChunks && cap(c) == 2*journalChunk {
			st.spare = append(st.spare, c[:0])
		}
	}
	st.chunksMu.Unlock()
	if st.journalBytes.Load() > checkpointBytes && st.checkpointing.CompareAndSwap(false, true) {
		st.wg.Go(func() {
			defer st.checkpointing.Store(false)
			if err := st.checkpoint(); err != nil {
				st.logger.Warn("allocator: checkpoint failed; the journal keeps growing until one succeeds", "err", err)
			}
		})
	}
	return end, nil
}

func (st *journal) runHook(stage string) error {
	if st.hook == nil {
		return nil
	}
	return st.hook(stage)
}

// put writes chunks to the journal in tx as one entry, keyed (end, chunk
// number) big-endian so that entries replay in order.
func (st *journal) put(tx *bolt.Tx, end uint64, chunks [][]byte) error {
	j := tx.Bucket(bucketJournal)
	j.FillPercent = 1 // append-only: full pages
	for n, c := range chunks {
		key := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint64(nil, end), uint16(n))
		if err := j.Put(key, c); err != nil { // bbolt keeps c until the commit ends
			return err
		}
		st.journalBytes.Add(int64(len(c)))
	}
	return nil
}

// checkpoint replays the journal into the keys and sessions buckets (each
// record once, at its latest state, in name order) and empties it, in one
// transaction.
func (st *journal) checkpoint() error {
	start := time.Now()
	var n int
	err := st.db.Update(func(tx *bolt.Tx) error {
		// The latest value of each record (nil: deleted), per kind (keys,
		// sessions). A journal holds many versions of few records: a name
		// is looked up without a string, and made one once.
		latest := [2]map[string]*[]byte{{}, {}}
		c := tx.Bucket(bucketJournal).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			n++
			err := ledger.RangeRecords(v, func(session bool, name, value []byte) error {
				m := latest[kindOf(session)]
				if p, ok := m[string(name)]; ok {
					*p = value
				} else {
					v := value // allocated for a new name only
					m[string(name)] = &v
				}
				return nil
			})
			if err != nil {
				// bbolt commits are atomic, so a torn entry means damage:
				// refuse rather than guess.
				return fmt.Errorf("allocator: journal entry %x: %w", k, err)
			}
		}
		for kind, name := range [2][]byte{bucketKeys, bucketSessions} {
			b := tx.Bucket(name)
			for _, rec := range slices.Sorted(maps.Keys(latest[kind])) { // name order: sequential B+tree updates
				var err error
				if v := *latest[kind][rec]; v != nil {
					err = b.Put([]byte(rec), bytes.Clone(v)) // v is tx memory, remapped on commit
				} else {
					err = b.Delete([]byte(rec))
				}
				if err != nil {
					return err
				}
			}
		}
		if err := tx.DeleteBucket(bucketJournal); err != nil {
			return err
		}
		_, err := tx.CreateBucket(bucketJournal)
		return err
	})
	if err != nil {
		return err
	}
	st.journalBytes.Store(0)
	st.logger.Debug("allocator: checkpoint", "entries", n, "took", time.Since(start))
	return nil
}

// kindOf indexes the keys (0) and sessions (1) buckets.
func kindOf(session bool) int {
	if session {
		return 1
	}
	return 0
}

// close closes memory, waits for a running checkpoint and closes the
// bbolt file; commits in progress finish first (bbolt's Close waits for
// them).
func (st *journal) close() error {
	if !st.shut() {
		return nil
	}
	st.wg.Wait()
	return st.db.Close()
}

// Open returns a durable Ledger stored in the bbolt file at path, creating
// it if needed, and recovers its state: every key and session durably
// written resumes exactly; a record that cannot be decoded or validated is
// not vouched for (its key starts with empty buckets, its session is
// forgotten) and is logged. Open fails if another process holds the file,
// and refuses a file that fails bbolt's consistency check (boltcheck: cut
// short, flipped bytes in its pages), naming it, rather than panic later
// in a transaction; a panic in bbolt while opening and recovering is
// recovered into such an error too.
//
// An option that applies only to a replicated Ledger is an error naming it.
func Open(path string, opts ...Option) (*Ledger, error) {
	cfg, err := configure(opts, journaled)
	if err != nil {
		return nil, err
	}
	m, err := newMemory(cfg)
	if err != nil {
		return nil, err
	}
	if err := boltcheck.Check(path, storeLockWait); err != nil {
		return nil, fmt.Errorf("allocator: store refused: %w", err)
	}
	st, err := openJournal(path, m, cfg)
	if err != nil {
		return nil, err
	}
	return &Ledger{cfg: cfg, store: st}, nil
}

// storeLockWait is how long Open waits for another process's lock on the
// store.
const storeLockWait = 5 * time.Second

// openJournal opens the bbolt file and recovers m's state from it.
func openJournal(path string, m *memory, cfg config) (st *journal, err error) {
	var db *bolt.DB
	defer func() {
		if p := recover(); p != nil {
			if db != nil {
				db.Close()
			}
			st, err = nil, fmt.Errorf("allocator: store refused: %s is damaged: %v", path, p)
		}
	}()
	// NoFreelistSync and the map freelist are safe (the freelist is rebuilt
	// at open) and make commits cheaper; NoSync is never set outside tests.
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: storeLockWait, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("allocator: open store %s: %w: another process holds its lock (a second allocator on the same data directory?)", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("allocator: open store %s: %w", path, err)
	}
	db.NoSync = cfg.noSync
	st = newJournal(db, m, cfg)
	if err := st.recover(m.state, m.now()); err != nil {
		db.Close()
		return nil, err
	}
	return st, nil
}

// recover loads the stored records into state, a fresh one; now is the
// instant from which keys not vouched for start empty.
func (st *journal) recover(state *ledger.State, now bucket.Instant) error {
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
		for _, b := range [][]byte{bucketKeys, bucketSessions, bucketJournal} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("allocator: prepare store: %w", err)
	}
	// Replay what the last run journaled, so that the journal starts empty
	// (positions restart at 0).
	if err := st.checkpoint(); err != nil {
		return fmt.Errorf("allocator: replay journal: %w", err)
	}
	var lost ledger.Changes
	err = st.db.View(func(tx *bolt.Tx) error {
		for kind, name := range [2][]byte{bucketKeys, bucketSessions} {
			session := kind == 1
			err := tx.Bucket(name).ForEach(func(k, v []byte) error {
				if err := state.Load(ledger.Record{Session: session, Name: string(k), Value: v}, now); err != nil {
					st.logger.Warn("allocator: record not vouched for: a key starts empty, a session is forgotten", "session", session, "err", err)
					if session {
						lost.Sessions = append(lost.Sessions, string(k))
					} else {
						lost.Keys = append(lost.Keys, string(k))
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("allocator: recover store: %w", err)
	}
	// Write what the state now vouches for in place of the records it could
	// not: a key empty from this start, a session forgotten. Otherwise the
	// next restart would meet the same damage and start the key empty again,
	// later.
	if !lost.Empty() {
		batch := state.AppendRecords(nil, lost)
		err := st.db.Update(func(tx *bolt.Tx) error {
			return ledger.DecodeRecords(batch, func(r ledger.Record) error {
				b := tx.Bucket(bucketKeys)
				if r.Session {
					b = tx.Bucket(bucketSessions)
				}
				if r.Value == nil {
					return b.Delete([]byte(r.Name))
				}
				return b.Put([]byte(r.Name), r.Value)
			})
		})
		if err != nil {
			return fmt.Errorf("allocator: replace records not vouched for: %w", err)
		}
	}
	stats := state.Stats()
	st.logger.Info("allocator: store recovered", "keys", stats.Keys, "sessions", stats.Sessions, "not_vouched", len(lost.Keys)+len(lost.Sessions))
	return nil
}
