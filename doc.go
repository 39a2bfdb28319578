// Package ration holds the vocabulary that every part of ration shares: a
// key's [Limits], an [Amount] of requests and tokens, the [Clock] that
// all time comes from, and the lease protocol's numeric bounds.
//
// The spender (in each gateway), the allocator, the gateway's keys file and
// the simulator all use these types, so a value one of them accepts is a
// value every other one accepts: [Limits.Validate] and [ValidKey] are the
// one place where those bounds are checked.
//
// Units: requests and tokens are whole units; rates are per minute; a
// burst is a bucket capacity in units. 0 as a rate means unlimited.
package ration
