package sidecar

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"sync"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender"
)

// errHoldsFull is returned by holds.open at the bound.
var errHoldsFull = errors.New("sidecar: too many open reservations")

// held is one admitted request whose usage is not known yet: its parts,
// what each reserved, and the budget key of each (to match a settlement
// by budget, as the Envoy pairs do).
type held struct {
	parts []spender.Reservation
	costs []ration.Amount
	keys  []string
	timer ration.Timer
}

// settleReserved settles every part at its reserved cost: the rule for a
// reservation nobody settled or cancelled in time.
func (h *held) settleReserved() {
	for i, p := range h.parts {
		p.Settle(h.costs[i])
	}
}

// holds are the reservations a sidecar keeps open between a reservation
// and its settlement, at most max at a time, each for at most hold. It is
// safe for concurrent use.
type holds struct {
	clock ration.Clock
	hold  time.Duration
	max   int
	// onExpire is called for each reservation settled at its reserved
	// cost because its hold time ran out.
	onExpire func()

	mu sync.Mutex
	m  map[string]*held // guarded by mu; a held leaves it exactly once (take or expiry)
	n  int              // guarded by mu: len(m) plus the slots claimed and not yet filled
}

func newHolds(clock ration.Clock, hold time.Duration, max int) *holds {
	return &holds{clock: clock, hold: hold, max: max, m: map[string]*held{}, onExpire: func() {}}
}

// claim takes a slot for a reservation about to be made, so that the bound
// is checked before anything is reserved. The caller fills it with put or
// gives it back with release.
func (hs *holds) claim() error {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.n >= hs.max {
		return errHoldsFull
	}
	hs.n++
	return nil
}

func (hs *holds) release() {
	hs.mu.Lock()
	hs.n--
	hs.mu.Unlock()
}

// put fills a claimed slot with h under id, held for after+hold; an
// earlier reservation under the same id is replaced and settled at its
// reserved cost.
func (hs *holds) put(id string, h *held, after time.Duration) {
	hs.mu.Lock()
	old := hs.m[id]
	if old != nil {
		old.timer.Stop()
		hs.n--
	}
	hs.m[id] = h
	h.timer = hs.clock.AfterFunc(after+hs.hold, func() { hs.expire(id, h) })
	hs.mu.Unlock()
	if old != nil {
		old.settleReserved()
	}
}

// expire settles h at its reserved cost if it is still held under id.
func (hs *holds) expire(id string, h *held) {
	hs.mu.Lock()
	if hs.m[id] != h {
		hs.mu.Unlock()
		return
	}
	delete(hs.m, id)
	hs.n--
	hs.mu.Unlock()
	h.settleReserved()
	hs.onExpire()
}

// take removes and returns the reservation held under id, or nil.
func (hs *holds) take(id string) *held {
	h, _ := hs.takeIf(id, func(*held) bool { return true })
	return h
}

// takeIf removes and returns the reservation held under id if ok accepts
// it; one it refuses stays held and is returned as mismatch.
func (hs *holds) takeIf(id string, ok func(*held) bool) (h, mismatch *held) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	h = hs.m[id]
	switch {
	case h == nil:
		return nil, nil
	case !ok(h):
		return nil, h
	}
	h.timer.Stop()
	delete(hs.m, id)
	hs.n--
	return h, nil
}

// open returns the number of reservations held.
func (hs *holds) open() int {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return len(hs.m)
}

// close settles every held reservation at its reserved cost (shutdown:
// their usage will never be known).
func (hs *holds) close() {
	hs.mu.Lock()
	all := hs.m
	hs.m = map[string]*held{}
	hs.n -= len(all)
	hs.mu.Unlock()
	for _, h := range all {
		h.timer.Stop()
		h.settleReserved()
	}
}

// idLen is the length of newID's ids.
const idLen = 22

// newID returns a random reservation id: 128 bits from crypto/rand,
// base64url, idLen characters.
func newID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand's documented contract)
	return base64.RawURLEncoding.EncodeToString(b[:])
}
