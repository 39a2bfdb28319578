package gateway

import (
	"crypto/sha256"
	"reflect"
	"slices"
	"sync/atomic"
)

// KeySource is where the gateway finds the keys to authenticate with: a
// *Keyring, which never changes, or a *LiveKeys, which a reload replaces.
// Each request calls Current once and uses that Keyring throughout.
type KeySource interface {
	// Current returns the keys to use now; never nil.
	Current() *Keyring
}

// LiveKeys is a KeySource whose Keyring can be replaced while requests
// are served: Swap stores the new one with one atomic pointer store.
// Requests that already called Current keep the Keyring they got (and the
// limits it gave their key) to the end; every later request sees the new
// one. It is safe for concurrent use. Make one with NewLiveKeys.
type LiveKeys struct {
	kr atomic.Pointer[Keyring]
}

// NewLiveKeys returns a LiveKeys serving kr, which must not be nil.
func NewLiveKeys(kr *Keyring) *LiveKeys {
	lk := &LiveKeys{}
	lk.Swap(kr)
	return lk
}

// Current returns the Keyring in force (nil for a nil *LiveKeys).
func (lk *LiveKeys) Current() *Keyring {
	if lk == nil {
		return nil
	}
	return lk.kr.Load()
}

// Swap puts kr in force and returns the Keyring it replaces (nil the
// first time). kr must not be nil: a LiveKeys always has keys.
func (lk *LiveKeys) Swap(kr *Keyring) *Keyring {
	if kr == nil {
		panic("gateway: LiveKeys.Swap(nil)")
	}
	return lk.kr.Swap(kr)
}

// KeysDiff is what changed from one Keyring to the next, by secret: a
// secret only in the new one is added, only in the old one removed, in
// both with another id, tenant or limits changed. A key whose secret is
// rotated is one removed and one added. The lists hold ids (never
// secrets) in file order.
type KeysDiff struct {
	Added, Removed, Changed []string
	Keys                    int // keys in the new Keyring
}

// DiffKeys compares two Keyrings; old may be nil (every key is added).
func DiffKeys(old, cur *Keyring) KeysDiff {
	d := KeysDiff{Keys: cur.Len()}
	var was map[[sha256.Size]byte]entry
	if old != nil {
		was = old.bySecret
	}
	// Walk in file order, so that the ids come out in a stable order.
	order := func(kr *Keyring) [][sha256.Size]byte {
		hs := make([][sha256.Size]byte, 0, len(kr.bySecret))
		pos := make(map[string]int, len(kr.ids))
		for i, id := range kr.ids {
			pos[id] = i
		}
		for h := range kr.bySecret {
			hs = append(hs, h)
		}
		slices.SortFunc(hs, func(a, b [sha256.Size]byte) int { return pos[kr.bySecret[a].key.ID] - pos[kr.bySecret[b].key.ID] })
		return hs
	}
	for _, h := range order(cur) {
		e := cur.bySecret[h]
		switch o, ok := was[h]; {
		case !ok:
			d.Added = append(d.Added, e.key.ID)
		case !reflect.DeepEqual(o, e): // its own limits, or its tenant's or models'
			d.Changed = append(d.Changed, e.key.ID)
		}
	}
	if old != nil {
		for _, h := range order(old) {
			if _, ok := cur.bySecret[h]; !ok {
				d.Removed = append(d.Removed, old.bySecret[h].key.ID)
			}
		}
	}
	return d
}
