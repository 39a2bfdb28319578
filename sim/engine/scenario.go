package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender"
)

// Skew says how a scenario spreads the key's traffic over live instances.
type Skew uint8

const (
	// Uniform sends each request to a live instance chosen uniformly.
	Uniform Skew = iota
	// Zipf sends a request to the k-th live instance (0-based) with
	// probability proportional to 1/(k+1)^s.
	Zipf
	// OneHot sends everything to the first live instance.
	OneHot
	// Rotate gives one hot instance HotShare of the traffic, the rest
	// uniformly to the others; the hot instance changes every Period.
	Rotate
	// Bursts picks, every Period, a random quarter of the live instances
	// (at least one) and spreads all traffic uniformly over them: each
	// instance is on or off in bursts while the total stays constant.
	Bursts
	// Fixed uses the scenario's Weights, one per instance.
	Fixed
	// Moving gives a busy quarter of the live instances (at least one)
	// HotShare of the traffic, spread uniformly over them, and the rest
	// uniformly to the others. Every Period the busy quarter moves on to
	// the next instances (period p's starts at live[p*k mod n], k its
	// size), so consecutive periods' busy sets do not overlap and every
	// instance takes its turn; the total stays constant.
	Moving
)

// Scenario is a traffic pattern and the conditions around it. Scenarios
// are values: the same scenario and seed always produce the same arrivals.
type Scenario struct {
	Name  string // short name, used on the command line and in file names
	About string // one line for the docs

	Skew     Skew
	ZipfS    float64       // Zipf exponent; default 1.1
	HotShare float64       // Rotate and Moving: the hot instance's or busy quarter's share; default 0.8
	Period   time.Duration // Rotate, Bursts and Moving: how often the pattern moves; default 10s, 5s and 5s
	Weights  []float64     // Fixed: weights by instance; need not sum to 1

	// Tokens makes requests carry a token cost: a prompt of 10 to 50
	// tokens plus a declared max_tokens of 4096 are reserved, the actual
	// output averages 300 tokens; TPM is the binding limit and
	// requests are not limited.
	Tokens bool

	// Charging is what each request is charged to: its one key (the
	// default), its API key and its team's shared budget, or an input-token
	// and an output-token budget. See Budgets.
	Charging Charging

	// OutageFrom and OutageTo bound an allocator outage as fractions of
	// the run's duration (both 0: none). During it every call is refused.
	OutageFrom, OutageTo float64

	Loss   float64       // message loss probability each way, on top of Config.Net
	Jitter time.Duration // network jitter, if larger than Config.Net's

	// Clusters, if not nil, spreads the scenario's keys over several
	// allocator clusters, one of which may be lost (see Clusters).
	Clusters *Clusters

	// Autoscale starts with N/2 instances, adds the others one by one
	// between 10% and 40% of the run, then removes them again, last in
	// first out, between 60% and 90%.
	Autoscale bool

	// Client adds a client that honours Retry-After, alone or beside the
	// scenario's traffic (see ClientMode).
	Client ClientMode

	// Limits are the scenario's own limits for its one key, used when
	// Config.Limits is zero; zero here: RPM 6000, or TPM 1,200,000 for a
	// tokens scenario.
	Limits ration.Limits
	// Duration is the scenario's own run length, used when
	// Config.Duration is zero; zero here: 5 minutes.
	Duration time.Duration
}

// ClientMode says whether a scenario has a client that honours
// Retry-After, the one whose retries the client contract measures
// (Result.Retries).
type ClientMode uint8

const (
	// NoClient: only the scenario's Poisson traffic, whose clients give
	// up on a 429.
	NoClient ClientMode = iota
	// ClientAlone is one client and no other traffic. It sends a request
	// and, once the response is complete, the next; a refused request it
	// sends again exactly spender.RetryAfterSeconds(Retry-After) seconds
	// later (the header's whole seconds, as the OpenAI SDKs wait), until
	// it is admitted. Each attempt, retries included, goes to the instance
	// the scenario's router picks at that instant (from the client's own
	// random stream): with Uniform, any instance, as behind a load
	// balancer with no affinity.
	ClientAlone
	// ClientBeside is that client beside the scenario's Poisson traffic
	// at Overload × rho, whose clients give up on a 429: the client's
	// retries compete with other requests, not with each other's.
	ClientBeside
)

// Scenarios returns the named scenarios in report order.
func Scenarios() []Scenario {
	return []Scenario{
		{Name: "uniform", About: "traffic spread evenly over the instances", Skew: Uniform},
		{Name: "zipf", About: "Zipf-skewed over the instances (s = 1.1)", Skew: Zipf},
		{Name: "one", About: "all traffic on one instance", Skew: OneHot},
		{Name: "rotating", About: "one hot instance takes 80%, a different one every 10 s", Skew: Rotate},
		{Name: "bursts", About: "a random quarter of the instances carries all traffic, redrawn every 5 s", Skew: Bursts},
		{Name: "moving", About: "a quarter of the instances carries 90% of the traffic, the others 10%; every 5 s the busy quarter moves on to the next instances", Skew: Moving, HotShare: 0.9},
		{Name: "autoscale", About: "N/2 instances, scaling to N and back (uniform traffic over the live ones)", Skew: Uniform, Autoscale: true},
		{Name: "outage", About: "Zipf traffic; the allocator is unreachable from 40% to 60% of the run", Skew: Zipf, OutageFrom: 0.4, OutageTo: 0.6},
		{Name: "lossy", About: "Zipf traffic; 5% of messages lost each way, 5 ms jitter", Skew: Zipf, Loss: 0.05, Jitter: 5 * time.Millisecond},
		{Name: "tokens", About: "Zipf traffic; TPM-bound, reserve prompt + max_tokens 4096, use ~300 output tokens", Skew: Zipf, Tokens: true},
		{Name: "tokens-io", About: "the tokens traffic charged to an input budget (ITPM 110,000: the prompt) and an output budget (OTPM 1,090,000: max_tokens 4096, ~300 used)", Skew: Zipf, Tokens: true, Charging: InputOutput},
		{Name: "team", About: "4 keys (RPM 4000, 3000, 2000, 1000; Zipf shares of the traffic), each request also charged to the team (RPM 6000); key k's traffic Zipf (s = 2) from instance k", Skew: Zipf, ZipfS: 2, Charging: KeyAndTeam},
		{Name: "clusters", About: "60 keys (Zipf shares of the load) over 3 allocator clusters by rendezvous hashing; cluster b is unreachable from 40% to 60% of the run", Skew: Zipf, OutageFrom: 0.4, OutageTo: 0.6, Clusters: &Clusters{Names: []string{"a", "b", "c"}, Lost: "b"}},
		{Name: "client", About: "one client alone on a 3 RPM key, sending again ⌈Retry-After⌉ s after each 429, each attempt on an instance drawn uniformly; an hour", Skew: Uniform, Client: ClientAlone, Limits: smallKey, Duration: time.Hour},
		{Name: "client-load", About: "that client beside other clients offering the load × the 3 RPM key's rate (uniform), who give up on a 429; an hour", Skew: Uniform, Client: ClientBeside, Limits: smallKey, Duration: time.Hour},
		{Name: "client-day", About: "that client alone on a per-day key (5 a day: waits in hours); 49 hours", Skew: Uniform, Client: ClientAlone, Limits: dayKey, Duration: 49 * time.Hour},
	}
}

// The client scenarios' keys: the gateway demo's small key, and a key of
// five requests a day (Limits.Window).
var (
	smallKey = ration.Limits{RPM: 3}
	dayKey   = ration.Limits{RPM: 5, Window: 24 * time.Hour}
)

// Loaded reports whether the scenario's traffic depends on the offered
// load (Config.Overload): every scenario but a client alone.
func (s Scenario) Loaded() bool { return s.Client != ClientAlone }

// Charging says which budgets each request of a scenario is charged to,
// all or nothing (spender.Limiter.ReserveAll when there are several).
type Charging uint8

const (
	// OneKey charges every request to the run's one key (Config.Limits).
	OneKey Charging = iota
	// KeyAndTeam charges each request to its API key, one of TeamKeys with
	// RPM 2/3, 1/2, 1/3 and 1/6 of Config.Limits.RPM, and to the team's
	// budget, Config.Limits, which every key shares: the keys' limits sum
	// to 5/3 of the team's, so the team binds. The keys' shares of the
	// traffic are Zipf (s = 1.1) and key k's requests arrive on the
	// scenario's skew rotated to start at instance k mod N.
	KeyAndTeam
	// InputOutput charges each request of the tokens traffic to an
	// input-token budget (ITPM 11/120 of Config.Limits.TPM: reserve the
	// prompt, settle the prompt) and an output-token budget (OTPM the rest:
	// reserve max_tokens, settle the output), both per minute. The traffic
	// is the tokens scenario's, request for request.
	InputOutput
)

// TeamKeys is the number of API keys in a KeyAndTeam scenario.
const TeamKeys = 4

// teamKeyShare is key k's share of the team's RPM, numerator over 6.
var teamKeyShare = [TeamKeys]int64{4, 3, 2, 1}

// budget is one budget a run charges: a key of the Limiters and the
// allocator, its limits, and the dimension it is measured in.
type budget struct {
	name string
	lim  ration.Limits
	dim  spender.Dimension
}

// budgets returns the budgets of a run of s whose binding limits are lim
// (Config.Limits), and the index of the primary one: the budget the
// result's headline numbers are in (the one key; the team; output tokens).
func (s Scenario) budgets(lim ration.Limits) (bs []budget, primary int) {
	switch s.Charging {
	case KeyAndTeam:
		for k, sh := range teamKeyShare {
			bs = append(bs, budget{name: fmt.Sprintf("key-%d", k), lim: ration.Limits{RPM: max(1, lim.RPM*sh/6)}, dim: spender.Requests})
		}
		return append(bs, budget{name: "team", lim: lim, dim: spender.Requests}), TeamKeys
	case InputOutput:
		in := max(1, lim.TPM*11/120)
		return []budget{
			{name: "in", lim: ration.Limits{TPM: in}, dim: spender.Tokens},
			{name: "out", lim: ration.Limits{TPM: max(1, lim.TPM-in)}, dim: spender.Tokens},
		}, 1
	}
	return []budget{{name: key, lim: lim, dim: s.Dim()}}, 0
}

// keyShares is the expected fraction of the traffic each API key sends
// (one key: all of it).
func (s Scenario) keyShares() []float64 {
	if s.Charging != KeyAndTeam {
		return []float64{1}
	}
	w := make([]float64, TeamKeys)
	sum := 0.0
	for k := range w {
		w[k] = 1 / math.Pow(float64(k+1), 1.1)
		sum += w[k]
	}
	for k := range w {
		w[k] /= sum
	}
	return w
}

// ScenarioByName returns the named scenario.
func ScenarioByName(name string) (Scenario, error) {
	for _, s := range Scenarios() {
		if s.Name == name {
			return s, nil
		}
	}
	var names []string
	for _, s := range Scenarios() {
		names = append(names, s.Name)
	}
	return Scenario{}, fmt.Errorf("engine: unknown scenario %q (want one of %v)", name, names)
}

// FixedSkew returns a scenario with the given per-instance weights.
func FixedSkew(name string, weights ...float64) Scenario {
	return Scenario{Name: name, About: fmt.Sprintf("fixed weights %v", weights), Skew: Fixed, Weights: weights}
}

// Dim is the scenario's binding dimension: Tokens for the tokens
// scenario, Requests otherwise.
func (s Scenario) Dim() spender.Dimension {
	if s.Tokens {
		return spender.Tokens
	}
	return spender.Requests
}

// DefaultLimits are the limits a run of s has when Config.Limits is zero:
// the scenario's own, or RPM 6000 (TPM 1,200,000 for a tokens scenario).
func (s Scenario) DefaultLimits() ration.Limits {
	if s.Limits != (ration.Limits{}) {
		return s.Limits
	}
	if s.Tokens {
		return ration.Limits{TPM: 1_200_000}
	}
	return ration.Limits{RPM: 6000}
}

func (s Scenario) zipfS() float64 {
	if s.ZipfS > 0 {
		return s.ZipfS
	}
	return 1.1
}

func (s Scenario) hotShare() float64 {
	if s.HotShare > 0 {
		return s.HotShare
	}
	return 0.8
}

func (s Scenario) period() time.Duration {
	switch {
	case s.Period > 0:
		return s.Period
	case s.Skew == Bursts, s.Skew == Moving:
		return 5 * time.Second
	}
	return 10 * time.Second
}

// Shares returns the expected fraction of traffic each of n live instances
// receives (averaged over time for Rotate, Bursts and Moving).
func (s Scenario) Shares(n int) []float64 {
	w := make([]float64, n)
	switch s.Skew {
	case Zipf:
		for k := range w {
			w[k] = 1 / math.Pow(float64(k+1), s.zipfS())
		}
	case OneHot:
		w[0] = 1
	case Fixed:
		copy(w, s.Weights)
	default:
		for k := range w {
			w[k] = 1
		}
	}
	sum := 0.0
	for _, v := range w {
		sum += v
	}
	for k := range w {
		w[k] /= sum
	}
	return w
}

// router picks each request's instance. It caches the cumulative weights
// of the current live set and the burst set of the current period.
type router struct {
	sc   Scenario
	seed uint64
	cum  []float64 // cumulative shares over the live set, for Zipf and Fixed
	n    int       // live count cum was built for

	burstPeriod int64   // the period burst was drawn for; -1 none
	burst       []int32 // indices into live of the hot set
}

func newRouter(sc Scenario, seed uint64) *router {
	return &router{sc: sc, seed: seed, burstPeriod: -1}
}

// pick returns the instance for a request arriving at t (virtual µs).
// rot rotates a Zipf, Fixed or OneHot ranking to start at live[rot mod n]
// (a team's key k uses rot = k); the other skews ignore it.
func (r *router) pick(rng *rand.Rand, t int64, live []int32, rot int) int32 {
	n := len(live)
	switch r.sc.Skew {
	case Uniform:
		return live[rng.IntN(n)]
	case OneHot:
		return live[rot%n]
	case Rotate:
		p := int64(r.sc.period() / time.Microsecond)
		hot := int((t / p) % int64(n))
		if n == 1 || rng.Float64() < r.sc.hotShare() {
			return live[hot]
		}
		k := rng.IntN(n - 1)
		if k >= hot {
			k++
		}
		return live[k]
	case Bursts:
		p := t / int64(r.sc.period()/time.Microsecond)
		if p != r.burstPeriod || len(r.burst) > n {
			r.drawBurst(p, n)
		}
		return live[r.burst[rng.IntN(len(r.burst))]]
	case Moving:
		k := max(1, n/4)
		p := t / int64(r.sc.period()/time.Microsecond)
		first := int(p * int64(k) % int64(n))
		if n == k || rng.Float64() < r.sc.hotShare() {
			return live[(first+rng.IntN(k))%n]
		}
		return live[(first+k+rng.IntN(n-k))%n]
	}
	if r.n != n {
		sh := r.sc.Shares(n)
		r.cum = r.cum[:0]
		acc := 0.0
		for _, v := range sh {
			acc += v
			r.cum = append(r.cum, acc)
		}
		r.n = n
	}
	u := rng.Float64()
	for k, c := range r.cum {
		if u < c {
			return live[(k+rot)%n]
		}
	}
	return live[(n-1+rot)%n]
}

// drawBurst chooses the hot quarter for period p from its own stream, so
// the choice depends only on the seed and the period.
func (r *router) drawBurst(p int64, n int) {
	rng := rand.New(rand.NewPCG(r.seed^0x9e3779b97f4a7c15, uint64(p)))
	idx := make([]int32, n)
	for k := range idx {
		idx[k] = int32(k)
	}
	k := max(1, n/4)
	for j := range k {
		m := j + rng.IntN(n-j)
		idx[j], idx[m] = idx[m], idx[j]
	}
	r.burst, r.burstPeriod = idx[:k], p
}

// membership returns the instances live at the start and the join and
// leave times (virtual µs) of the others, for a fleet of n over d.
func (s Scenario) membership(n int, d time.Duration) (initial int, joins, leaves []int64) {
	if !s.Autoscale || n < 2 {
		return n, nil, nil
	}
	initial = max(1, n/2)
	m := n - initial
	T := float64(d / time.Microsecond)
	for j := range m { // instance initial+j joins, then leaves last in first out
		joins = append(joins, int64(T*(0.1+0.3*float64(j)/float64(m))))
		leaves = append(leaves, int64(T*(0.9-0.3*float64(j)/float64(m))))
	}
	return initial, joins, leaves
}

// outage returns the outage window in virtual µs (from == to: none).
func (s Scenario) outage(d time.Duration) (from, to int64) {
	T := float64(d / time.Microsecond)
	return int64(T * s.OutageFrom), int64(T * s.OutageTo)
}
