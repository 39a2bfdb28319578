package boltcheck

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// store writes a bbolt file of a few hundred pages, without its freelist
// as the allocator's store, and returns its path.
func store(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range []string{"keys", "sessions"} {
			b, err := tx.CreateBucket([]byte(name))
			if err != nil {
				return err
			}
			for i := range 10_000 {
				if err := b.Put(fmt.Appendf(nil, "%s-%08d", name, i), []byte(strings.Repeat("v", 40))); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// readAll opens path for writing, as a store does, and reads every key.
func readAll(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	n := 0
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return b.ForEach(func(_, _ []byte) error { n++; return nil }) })
	})
	if err != nil || n != 20_000 {
		t.Fatalf("read %d keys, %v; want 20000", n, err)
	}
}

// TestCheck: a sound file and a missing one pass; a file cut in half, at
// random pages, or to a few bytes, with both meta pages overwritten, or
// with random bytes written over its branch and leaf pages, is refused
// with an error naming it, and never a panic (nor a fault reading past
// the end of the file); a cut that took only free pages passes, and the
// file then opens and reads whole.
func TestCheck(t *testing.T) {
	good := store(t)
	if err := Check(good, time.Second); err != nil {
		t.Fatalf("a sound file: %v", err)
	}
	if err := Check(filepath.Join(t.TempDir(), "none.db"), time.Second); err != nil {
		t.Fatalf("a missing file: %v", err)
	}
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	page := os.Getpagesize()
	damaged := map[string]func([]byte) []byte{
		"cut in half":      func(b []byte) []byte { return b[:len(b)/2] },
		"cut to 100 bytes": func(b []byte) []byte { return b[:100] },
		"meta pages overwritten": func(b []byte) []byte {
			for i := range 2 * page {
				b[i] = 0xa5
			}
			return b
		},
	}
	for seed := range 4 {
		damaged[fmt.Sprintf("cut at a random page (seed %d)", seed)] = func(b []byte) []byte {
			r := rand.New(rand.NewPCG(uint64(seed), 2))
			return b[:(2+r.IntN(len(b)/page-3))*page+r.IntN(page)]
		}
	}
	for seed := range 8 {
		damaged[fmt.Sprintf("data pages flipped (seed %d)", seed)] = func(b []byte) []byte {
			r := rand.New(rand.NewPCG(uint64(seed), 1))
			for range 64 {
				p := 2 + r.IntN(len(b)/page-2) // past the meta pages
				off := p*page + r.IntN(64)     // the page header and first elements
				b[off] ^= byte(1 + r.IntN(255))
			}
			return b
		}
	}
	for name, damage := range damaged {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "store.db")
			if err := os.WriteFile(path, damage(append([]byte{}, data...)), 0o600); err != nil {
				t.Fatal(err)
			}
			err := Check(path, time.Second)
			if err == nil && strings.HasPrefix(name, "cut at") {
				// The pages cut were free ones: what the file holds is
				// whole, and a store opens and reads it.
				readAll(t, path)
				return
			}
			if err == nil {
				t.Fatalf("a file %s passed the check", name)
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "is damaged") {
				t.Fatalf("the error does not name the file and say why: %v", err)
			}
			t.Log(err)
		})
	}
}
