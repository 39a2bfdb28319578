package allocator

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rationhq/ration"
	bolt "go.etcd.io/bbolt"
)

var (
	bucketKeys     = []byte("keys")
	bucketSessions = []byte("sessions")
	bucketJournal  = []byte("journal")
	bucketMeta     = []byte("meta")
	metaFormat     = []byte("format")
)

// storeFormat names the layout of the store and the newest record version
// it may hold. Format 1 (records of version 1 only) is upgraded in place on
// Open: its records still decode, and writing the new name makes an older
// binary refuse the store (it could not read version 2 records) instead
// of treating them as lost state.
const (
	storeFormat  = "ration-allocator/2"
	storeFormat1 = "ration-allocator/1"
)

// checkpointBytes is how much journal triggers a checkpoint.
const checkpointBytes = 64 << 20

// Journal entry operations.
const (
	opKeyPut byte = iota + 1
	opKeyDelete
	opSessionPut
	opSessionDelete
)

// recID names a stored record: a key's state or a spender's session. The
// log holds one per change; the record itself (keyState.mark,
// session.mark) remembers the position of its latest change, so marking
// costs no map operation.
type recID struct {
	session bool
	name    string
}

// logEntry is one change in the log: the record's id and the state it
// changed (nil if deleted), so a commit encodes it without looking its
// name up again.
type logEntry struct {
	recID
	ks *keyState
	s  *session
}

// store makes a Ledger durable in bbolt. Calls apply in memory, mark the
// records they changed, and wait in sync for a group commit that writes
// those records' state as of commit time. Because every commit writes the
// whole current state of every record changed so far, what is on disk is
// always the state after some prefix of the applied calls, and a call is
// answered only once a commit covering it has been synced.
//
// A commit appends the changed records as one entry to the journal bucket
// (one Put of a few kilobytes instead of one random B+tree update per key);
// a checkpoint, run in the background once the journal passes
// checkpointBytes and at Open, replays the journal into the keys and
// sessions buckets in one transaction and empties it. Replay is idempotent
// and ordered (entries are keyed by log position), so a crash at any point
// leaves a journal that replays to the same state.
//
// log and base, and the records' marks, are guarded by the ledger's mutex.
type store struct {
	db  *bolt.DB
	l   *Ledger
	obs func(time.Duration, error)

	sleep func(time.Duration) // time.Sleep; tests replace it

	journalBytes  atomic.Int64   // journal written since the last checkpoint
	checkpointing atomic.Bool    // a checkpoint goroutine is running
	wg            sync.WaitGroup // the checkpoint goroutine

	log  []logEntry // records in the order they were marked, from position base
	base uint64     // log position of log[0] (from 1); everything before it is durable

	cmu        sync.Mutex // guards the fields below
	cond       *sync.Cond // on cmu: a commit finished
	committing bool       // a commit is in flight
	durable    uint64     // log position up to which everything is durable
	arrived    int        // calls that entered sync since the last commit began
	lastBatch  int        // calls that entered sync during the previous commit cycle

	// Journal chunk buffers, owned by the commit in flight: in use until
	// its transaction ends (bbolt keeps Put values until then), then spare.
	used, spare [][]byte
}

// markKey records that key name changed; ks is its state, nil if deleted.
func (l *Ledger) markKey(name string, ks *keyState) {
	if l.st != nil {
		pos := l.st.mark(logEntry{recID: recID{name: name}, ks: ks})
		if ks != nil {
			ks.mark = pos
		}
	}
}

// markSession records that spender id's session changed; nil if deleted.
func (l *Ledger) markSession(id string, s *session) {
	if l.st != nil {
		pos := l.st.mark(logEntry{recID: recID{session: true, name: id}, s: s})
		if s != nil {
			s.mark = pos
		}
	}
}

func (st *store) mark(id logEntry) uint64 {
	n := len(st.log)
	pos := st.base + uint64(n)
	if n == cap(st.log) {
		st.log = append(st.log, id)
		return pos
	}
	// Field by field: a whole-entry store is a typed copy that runs the
	// GC's bulk write barrier while a collection is marking.
	st.log = st.log[:n+1]
	e := &st.log[n]
	e.session, e.name, e.ks, e.s = id.session, id.name, id.ks, id.s
	return pos
}

// sync returns once every change marked so far is durable.
func (l *Ledger) sync(context.Context) error {
	if l.st == nil {
		return nil
	}
	l.mu.Lock()
	end := l.logEnd()
	l.mu.Unlock()
	return l.st.sync(end)
}

// logEnd returns the log position after every change marked so far; 0
// for a memory-only ledger. Call it with l.mu held.
func (l *Ledger) logEnd() uint64 {
	if l.st == nil {
		return 0
	}
	return l.st.base + uint64(len(l.st.log))
}

// syncTo returns once every change before log position target (a logEnd
// taken under the same hold of l.mu as the call's changes) is durable.
func (l *Ledger) syncTo(target uint64) error {
	if l.st == nil {
		return nil
	}
	return l.st.sync(target)
}

// sync returns once every record changed before log position target is
// durable.
//
// It is a leader/follower group commit: at most one commit is in flight;
// a caller that finds one running waits for it, and if that commit did not
// cover its changes, the first waiter to wake commits everything marked so
// far on behalf of all of them. So the calls that arrive during one fsync
// share the next. (bbolt's own db.Batch was measured and rejected for
// this: each batch arms its own timer and queues on the writer lock, so
// under load many small batches each pay an fsync; docs/allocator.md.)
//
// The caller passes target rather than sync reading it, so that a call
// takes the ledger mutex once, not a second time only to read the log end.
// A commit cannot be abandoned halfway, so there is no context.
func (st *store) sync(target uint64) error {
	st.cmu.Lock()
	st.arrived++
	for st.durable < target && st.committing {
		st.cond.Wait()
	}
	if st.durable >= target {
		st.cmu.Unlock()
		return nil
	}
	st.committing = true
	last := st.lastBatch
	st.cmu.Unlock()

	// Under concurrent load, linger so that more calls share the fsync (on
	// this kind of VM an fsync costs ~100 µs of CPU); a lone caller
	// commits at once.
	if linger := st.l.cfg.linger; last > 1 && linger > 0 {
		st.linger(linger, last)
	}
	st.cmu.Lock()
	st.lastBatch, st.arrived = st.arrived, 0
	st.cmu.Unlock()

	start := time.Now()
	var end uint64
	err := st.db.Update(func(tx *bolt.Tx) error {
		// Encode under the ledger mutex (the records' state as of end),
		// then put the chunks into the journal without it: bbolt's work
		// (B+tree descent, node allocations) need not stall calls.
		st.l.mu.Lock()
		if h := st.l.cfg.hook; h != nil {
			if err := h("before"); err != nil {
				st.l.mu.Unlock()
				return err
			}
		}
		end = st.base + uint64(len(st.log))
		chunks := st.encode(st.base, end)
		st.l.mu.Unlock()
		if err := st.put(tx, end, chunks); err != nil {
			return err
		}
		if h := st.l.cfg.hook; h != nil {
			return h("after")
		}
		return nil
	})
	if st.obs != nil {
		st.obs(time.Since(start), err)
	}
	if len(st.spare) < 256 { // keep at most ~1 MiB of buffers
		st.spare = append(st.spare, st.used...)
	}
	clear(st.used)
	st.used = st.used[:0]
	if err == nil {
		st.l.mu.Lock()
		st.trim(end)
		st.l.mu.Unlock()
	}
	st.cmu.Lock()
	st.committing = false
	if err == nil && end > st.durable {
		st.durable = end
	}
	st.cond.Broadcast()
	st.cmu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotDurable, err)
	}
	if st.journalBytes.Load() > checkpointBytes && st.checkpointing.CompareAndSwap(false, true) {
		st.wg.Add(1)
		go func() {
			defer st.wg.Done()
			defer st.checkpointing.Store(false)
			if err := st.checkpoint(); err != nil {
				st.l.cfg.logger.Warn("allocator: checkpoint failed; the journal keeps growing until one succeeds", "err", err)
			}
		}()
	}
	return nil
}

// lingerStep is the step of a commit's linger: under light load it
// lingers on while each step brings more calls.
const lingerStep = time.Millisecond

// lingerCalls is the batch that ends a linger early: shared by this many
// calls, a commit's two fsyncs (~100-200 µs of CPU each on this VM) cost a
// few µs per call, a few percent of even a 1-key call's CPU over loopback,
// so waiting longer would add latency (and, for callers that wait for
// their reply before calling again, idle CPU) for little gain.
const lingerCalls = 64

// linger waits for more calls to join the next commit, in steps of
// lingerStep, until lingerCalls calls wait for it, at most max in all; last
// is the number of calls in the previous commit cycle. After a light cycle
// (last below sustainedBatch) a step without a call ends it: the load is
// too light for waiting longer to pay, and a sparse caller's latency grows
// by one step at most. After a sustained one a quiet step ends it only
// once the batch is as large as the last: under load calls arrive in
// bursts (each commit releases its batch at once, and their next calls
// come back together), so a quiet millisecond says little about the next,
// and ending there left 64-key commits with ~29 calls instead of ~37 (at a
// 4 ms linger; docs/results.md, round 5); but once every caller of a
// small, closed population waits (as many as last time), no call is coming
// and waiting on would only add latency.
func (st *store) linger(max time.Duration, last int) {
	for waited := time.Duration(0); waited < max; waited += lingerStep {
		st.cmu.Lock()
		before := st.arrived
		st.cmu.Unlock()
		if before >= lingerCalls {
			return
		}
		st.sleep(min(lingerStep, max-waited))
		st.cmu.Lock()
		now := st.arrived
		st.cmu.Unlock()
		if now == before && (last < sustainedBatch || now >= last) {
			return
		}
	}
}

// sustainedBatch is the number of calls in a commit cycle from which the
// next linger counts the load as sustained (see linger).
const sustainedBatch = lingerCalls / 4

// journalChunk is the size at which a journal entry is cut into another
// value: a few pages each, so bbolt writes a commit in a few runs (one
// WriteAt per page run) without one huge buffer. 3 KB, 15 KB and 60 KB
// measured within noise of each other; 15 KB was the best of the three.
const journalChunk = 15000

// encode returns the current state of the records marked at log positions
// [from, end), each record once (at its latest mark), as journal chunks of
// about journalChunk bytes, with l.mu held. The chunks are the commit's
// buffers (st.used).
func (st *store) encode(from, end uint64) [][]byte {
	if from >= end {
		return nil
	}
	e := enc{b: st.buffer()}
	var val []byte
	for pos := from; pos < end; pos++ {
		id := &st.log[pos-st.base]
		var op byte
		// A record deleted at pos and recreated later gets its delete
		// here and its put at the later position, in this same entry.
		if id.session {
			s := id.s
			switch {
			case s == nil:
				op = opSessionDelete
			case s.mark != pos:
				continue // changed again later; written then
			default:
				op = opSessionPut
				val = appendSession(val[:0], s)
			}
		} else {
			k := id.ks
			switch {
			case k == nil:
				op = opKeyDelete
			case k.mark != pos:
				continue
			default:
				op = opKeyPut
				val = appendKey(val[:0], k)
			}
		}
		e.byte(op)
		e.str(id.name)
		if op == opKeyPut || op == opSessionPut {
			e.u(uint64(len(val)))
			e.b = append(e.b, val...)
		}
		if len(e.b) >= journalChunk {
			st.used[len(st.used)-1] = e.b
			e.b = st.buffer()
		}
	}
	st.used[len(st.used)-1] = e.b
	return st.used
}

// put appends chunks to the journal in tx as one entry, keyed (end, chunk
// number) big-endian so that entries replay in order.
func (st *store) put(tx *bolt.Tx, end uint64, chunks [][]byte) error {
	j := tx.Bucket(bucketJournal)
	j.FillPercent = 1 // append-only: full pages
	var n uint16
	for _, c := range chunks {
		if len(c) == 0 {
			continue
		}
		key := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint64(make([]byte, 0, 10), end), n)
		if err := j.Put(key, c); err != nil { // bbolt keeps c until the commit ends
			return err
		}
		st.journalBytes.Add(int64(len(c)))
		n++
	}
	return nil
}

// buffer returns an empty chunk buffer for the commit in flight.
func (st *store) buffer() []byte {
	var b []byte
	if n := len(st.spare); n > 0 {
		b, st.spare = st.spare[n-1][:0], st.spare[:n-1]
	} else {
		b = make([]byte, 0, journalChunk+512)
	}
	st.used = append(st.used, b)
	return b
}

// checkpoint replays the journal into the keys and sessions buckets (each
// record once, at its latest state, in key order) and empties it, in one
// transaction.
func (st *store) checkpoint() error {
	start := time.Now()
	var n int
	err := st.db.Update(func(tx *bolt.Tx) error {
		// The latest op of every record, by name: a journal holds many
		// versions of few records, so names are looked up without
		// allocating and kept once per record.
		type rec struct {
			name string
			op   byte
			val  []byte
		}
		var recs []rec
		index := [2]map[string]int{make(map[string]int), make(map[string]int)} // keys, sessions
		j := tx.Bucket(bucketJournal)
		c := j.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			n++
			d := &dec{b: v}
			for len(d.b) > 0 && d.err == nil {
				op := d.byte()
				name := d.bytes(max(ration.MaxKeyLen, ration.MaxSpenderIDLen))
				var val []byte
				if op == opKeyPut || op == opSessionPut {
					m := d.u()
					if m > uint64(len(d.b)) {
						d.fail()
						break
					}
					val = d.b[:m:m] // cloned when put: tx memory may be remapped on commit
					d.b = d.b[m:]
				} else if op != opKeyDelete && op != opSessionDelete {
					d.fail()
				}
				kind := 0
				if op == opSessionPut || op == opSessionDelete {
					kind = 1
				}
				if i, ok := index[kind][string(name)]; ok {
					recs[i].op, recs[i].val = op, val
				} else {
					r := rec{name: string(name), op: op, val: val}
					index[kind][r.name] = len(recs)
					recs = append(recs, r)
				}
			}
			if d.err != nil {
				// A torn entry cannot come from bbolt (commits are atomic);
				// refuse rather than guess.
				return fmt.Errorf("allocator: journal entry %x: %w", k, d.err)
			}
		}
		for kind, b := range []*bolt.Bucket{tx.Bucket(bucketKeys), tx.Bucket(bucketSessions)} {
			names := make([]string, 0, len(index[kind]))
			for name := range index[kind] {
				names = append(names, name)
			}
			slices.Sort(names) // key order: sequential B+tree updates
			for _, name := range names {
				r := &recs[index[kind][name]]
				var err error
				if r.op == opKeyPut || r.op == opSessionPut {
					err = b.Put([]byte(name), bytes.Clone(r.val))
				} else {
					err = b.Delete([]byte(name))
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
	st.l.cfg.logger.Debug("allocator: checkpoint", "entries", n, "took", time.Since(start))
	return nil
}

// trim forgets log positions before end: they are durable.
func (st *store) trim(end uint64) {
	if end <= st.base {
		return
	}
	n := end - st.base
	rest := copy(st.log, st.log[n:])
	clear(st.log[rest:])
	st.log = st.log[:rest]
	st.base = end
}

func (st *store) close() error {
	st.wg.Wait()
	return st.db.Close()
}

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
	// NoFreelistSync and the map freelist are safe (the freelist is rebuilt
	// at open) and make commits cheaper; NoSync is never set outside tests.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return nil, fmt.Errorf("allocator: open store %s: %w", path, err)
	}
	db.NoSync = l.cfg.noSync
	st := &store{db: db, l: l, obs: l.cfg.commitObserver, sleep: time.Sleep, base: 1, durable: 1}
	st.cond = sync.NewCond(&st.cmu)
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
		case f == nil, string(f) == storeFormat1:
			if err := meta.Put(metaFormat, []byte(storeFormat)); err != nil {
				return err
			}
		case string(f) != storeFormat:
			return fmt.Errorf("allocator: store format %q, want %q (or %q, upgraded in place)", f, storeFormat, storeFormat1)
		}
		if _, err := tx.CreateBucketIfNotExists(bucketKeys); err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists(bucketJournal); err != nil {
			return err
		}
		_, err = tx.CreateBucketIfNotExists(bucketSessions)
		return err
	})
	if err != nil {
		return fmt.Errorf("allocator: prepare store: %w", err)
	}
	// Replay what the last run journaled, so that the journal starts empty
	// (log positions restart at 0).
	if err := st.checkpoint(); err != nil {
		return fmt.Errorf("allocator: replay journal: %w", err)
	}
	l := st.l
	now := l.now()
	lost := 0
	err = st.db.View(func(tx *bolt.Tx) error {
		err := tx.Bucket(bucketKeys).ForEach(func(k, v []byte) error {
			ks, err := decodeKey(v)
			if err != nil || len(k) == 0 || len(k) > ration.MaxKeyLen {
				l.cfg.logger.Warn("allocator: key state not vouched for; it starts empty", "err", err)
				ks = &keyState{fresh: true, emptyFrom: now}
				lost++
			}
			ks.name = string(k)
			l.keys[ks.name] = ks
			return nil
		})
		if err != nil {
			return err
		}
		return tx.Bucket(bucketSessions).ForEach(func(k, v []byte) error {
			s, err := decodeSession(v)
			if err != nil || len(k) == 0 || len(k) > ration.MaxSpenderIDLen {
				l.cfg.logger.Warn("allocator: session not vouched for; forgotten", "spender", string(k), "err", err)
				lost++
				return nil
			}
			s.id = string(k)
			l.sessions[s.id] = s
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("allocator: recover store: %w", err)
	}
	l.cfg.logger.Info("allocator: store recovered", "keys", len(l.keys), "sessions", len(l.sessions), "not_vouched", lost)
	return nil
}
