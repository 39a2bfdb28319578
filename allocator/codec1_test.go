package allocator

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/rationhq/ration"
	bolt "go.etcd.io/bbolt"
)

// A store of format 1 (version 1 records, in the buckets and in the
// journal) opens, resumes exactly, answers a retry with the stored reply,
// snapshots included (version 1 stored them), and is marked format 2.
func TestStoreFormat1Upgrades(t *testing.T) {
	clk := newFakeClock()
	l := newLedger(t, clk)
	k := []AcquireKey{
		{Key: "k1", Limits: tpm(600), Want: ration.Amount{Requests: 1, Tokens: 100}},
		{Key: "k2", Limits: ration.Limits{RPM: 60, TPM: 6000, BurstTokens: 9000}, Want: ration.Amount{Requests: 2, Tokens: 700}, Debt: ration.Amount{Requests: 0, Tokens: 50}},
		{Key: "k3", Limits: ration.Limits{TPM: 6000}, Want: ration.Amount{Requests: 0, Tokens: 70}},
	}
	r1, err := l.Acquire(ctx, caller("a", 1, 1), k)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, caller("b", 2, 5), k[:2]); err != nil {
		t.Fatal(err)
	}
	before := dump(l)

	path := tempDB(t)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, _ := tx.CreateBucket(bucketMeta)
		keys, _ := tx.CreateBucket(bucketKeys)
		sessions, _ := tx.CreateBucket(bucketSessions)
		journal, _ := tx.CreateBucket(bucketJournal)
		if err := meta.Put(metaFormat, []byte(storeFormat1)); err != nil {
			return err
		}
		var e enc
		encodeKeyV1(&e, l.keys["k1"])
		if err := keys.Put([]byte("k1"), e.b); err != nil {
			return err
		}
		e = enc{}
		encodeSessionV1(&e, l.sessions["b"])
		if err := sessions.Put([]byte("b"), e.b); err != nil {
			return err
		}
		// k2, k3 and a's session only in the journal.
		var j enc
		for _, name := range []string{"k2", "k3"} {
			var v enc
			encodeKeyV1(&v, l.keys[name])
			j.byte(opKeyPut)
			j.str(name)
			j.u(uint64(len(v.b)))
			j.b = append(j.b, v.b...)
		}
		var v enc
		encodeSessionV1(&v, l.sessions["a"])
		j.byte(opSessionPut)
		j.str("a")
		j.u(uint64(len(v.b)))
		j.b = append(j.b, v.b...)
		return journal.Put(binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint64(nil, 7), 0), j.b)
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	l2 := openLedger(t, path, clk)
	if got := dump(l2); got != before {
		t.Fatal("state read from a format 1 store differs")
	}
	r2, err := l2.Acquire(ctx, caller("a", 1, 1), k)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(*r2) != fmt.Sprint(*r1) {
		t.Fatalf("retry from a format 1 store: %+v, want stored %+v", *r2, *r1)
	}
	l2.Close()
	db, err = bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	var f string
	db.View(func(tx *bolt.Tx) error { f = string(tx.Bucket(bucketMeta).Get(metaFormat)); return nil })
	db.Close()
	if f != storeFormat {
		t.Fatalf("format after open: %q, want %q", f, storeFormat)
	}
}

// The version 1 encoders, as format 1 wrote them.
func encodeKeyV1(e *enc, k *keyState) {
	e.byte(recordVersion1)
	if k.fresh {
		e.byte(flagFresh)
		e.i(int64(k.emptyFrom))
		return
	}
	e.byte(0)
	e.i(k.lim.RPM)
	e.i(k.lim.TPM)
	e.i(k.lim.BurstRequests)
	e.i(k.lim.BurstTokens)
	for _, d := range []*dim{&k.req, &k.tok} {
		if d.on {
			s := d.b.State()
			e.i(s.Level)
			e.i(int64(s.Last))
		}
	}
	e.u(uint64(len(k.holds)))
	for i := range k.holds {
		h := &k.holds[i]
		e.str(h.spender)
		e.u(h.epoch)
		e.u(h.lastSeq)
		e.amount(h.held)
		e.amount(h.rate)
		e.i(int64(h.expiry))
	}
}
func encodeSessionV1(e *enc, s *session) {
	e.byte(recordVersion1)
	e.u(s.epoch)
	e.u(s.seq)
	e.b = binary.LittleEndian.AppendUint64(e.b, uint64(s.digest))
	e.byte(byte(s.kind))
	if s.released {
		e.byte(1)
	} else {
		e.byte(0)
	}
	e.i(int64(s.seen))
	switch r := s.reply.(type) {
	case *AcquireReply:
		e.dur(r.LeaseTTL)
		e.u(uint64(len(r.Keys)))
		for i := range r.Keys {
			x := &r.Keys[i]
			e.byte(byte(x.Status))
			e.amount(x.Granted)
			e.amount(x.Returned)
			e.amount(x.Held)
			e.dur(x.RetryAfter)
			encodeSnapshotV1(e, &x.Snapshot)
			e.u(uint64(x.ActiveSpenders))
		}
	case *ReserveReply:
		e.dur(r.LeaseTTL)
		e.u(uint64(len(r.Keys)))
		for i := range r.Keys {
			x := &r.Keys[i]
			e.byte(byte(x.Status))
			e.dur(x.Wait)
			e.amount(x.Held)
			encodeSnapshotV1(e, &x.Snapshot)
			e.u(uint64(x.ActiveSpenders))
		}
	case *ReleaseReply:
		e.u(uint64(len(r.Returned)))
		for _, a := range r.Returned {
			e.amount(a)
		}
	}
}
func encodeSnapshotV1(e *enc, s *Snapshot) {
	for _, d := range []*DimSnapshot{&s.Requests, &s.Tokens} {
		e.i(d.Limit)
		e.i(d.Remaining)
		e.dur(d.Reset)
	}
}
