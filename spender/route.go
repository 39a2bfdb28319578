package spender

// Rendezvous hashing (highest random weight) of a key over cluster names.
// Every gateway must send a key to the same cluster, whatever process,
// version or order of configuration it runs, so the hash is a fixed,
// documented function of the bytes alone (no per-process seed, unlike the
// Limiter's shard hash):
//
//	score(name, key) = fmix64(FNV-1a-64(name ‖ 0x00 ‖ key))
//
// FNV-1a 64 with its standard offset basis and prime, over the cluster's
// name, one zero byte (names hold none, so distinct (name, key) pairs hash
// distinct strings) and the key; fmix64 is MurmurHash3's 64-bit finaliser,
// which spreads FNV's weakly mixed last bytes over every bit. A key goes
// to the cluster with the highest score; on a tie, to the smaller name.
// Adding a cluster moves only the keys whose new highest score is the new
// cluster's (about 1/(n+1) of them); removing one moves only its own keys.
// Changing any of this moves keys between clusters on a rolling upgrade:
// TestRouteIsPinned holds the function to its values.

const (
	fnvOffset64 = 14695981039346656037 // FNV-1a 64 offset basis
	fnvPrime64  = 1099511628211        // FNV-1a 64 prime
)

// fnv1a continues FNV-1a 64 from state h over s.
func fnv1a(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime64
	}
	return h
}

// fmix64 is MurmurHash3's 64-bit finaliser.
func fmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

// namePrefix is the FNV-1a state after a cluster's name and the zero byte.
func namePrefix(name string) uint64 {
	return fnv1a(fnv1a(fnvOffset64, name), "\x00")
}

// highest returns the index of the winning cluster for key, cluster i
// having name names[i] and hash prefix prefixes[i] (namePrefix); -1 when
// there is none.
func highest(prefixes []uint64, names []string, key string) int {
	best, bestScore := -1, uint64(0)
	for i, p := range prefixes {
		s := fmix64(fnv1a(p, key))
		if best < 0 || s > bestScore || s == bestScore && names[i] < names[best] {
			best, bestScore = i, s
		}
	}
	return best
}

// Route returns the index in names of the cluster key is routed to by
// rendezvous hashing (see Router), or -1 when names is empty. The choice
// depends only on the set of names and the key: every gateway given the
// same names, in any order, routes a key to the same name. Names should
// be distinct and hold no zero byte (NewRouter checks; Route does not).
func Route(names []string, key string) int {
	prefixes := make([]uint64, len(names))
	for i, n := range names {
		prefixes[i] = namePrefix(n)
	}
	return highest(prefixes, names, key)
}
