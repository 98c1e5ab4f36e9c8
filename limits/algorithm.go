package limits

// Algorithm names a rate-limit algorithm as written in the config file.
type Algorithm string

// The algorithms rategate implements. Their semantics are in docs/algorithms.md.
const (
	FixedWindow   Algorithm = "fixed_window"
	SlidingLog    Algorithm = "sliding_log"
	SlidingWindow Algorithm = "sliding_window"
	GCRA          Algorithm = "gcra"
	TokenBucket   Algorithm = "token_bucket"
)

// AlgorithmInfo is one algorithm's row in the algorithm table: everything
// about it that the config, key building, the Lua builder and the stores
// need to agree on.
type AlgorithmInfo struct {
	Name Algorithm
	// Code is the number decide.lua and refund.lua receive in ARGV for it
	// (1-based); its script is lua/<Name>.lua, whose functions are named
	// <Name>, <Name>_put and <Name>_refund.
	Code int
	// Suffix ends its keys (<prefix>:{<rule>:<identity>}:<suffix>), so two
	// algorithms never read each other's state. A trailing digit counts the
	// record's layouts: a build that changes the layout changes the
	// suffix, so builds that share a Redis during a rolling update never
	// read each other's records (each counts on its own until the old one
	// is gone; the new one starts afresh, once).
	Suffix string
	// Record names the numbers of the algorithm's Redis record, in order,
	// when it is a string of little-endian doubles (struct.pack('<dd…') in
	// lua/<Name>.lua; a double holds every integer below 2^53 exactly);
	// nil when the record is a hash or a sorted set.
	Record []string
	// Burst says whether it has a burst separate from its limit.
	Burst bool
	// MaxLimit bounds a rule's limit below the general bound; 0 = none.
	MaxLimit int64
	// Leasable says whether a rule of it can be leased exactly (lease.go).
	// sliding_log cannot: its admissions leave the log one period after
	// their own time, so a unit spent later than it was counted would
	// leave early.
	Leasable bool
}

// MaxSlidingLogLimit is the largest limit a sliding_log rule may have (config
// validation enforces it). The log keeps one Redis entry, about 110 bytes,
// per admitted request for a whole period, and the one decision that is not
// O(log n), an admission just after many entries left together, removes
// them all: measured on Redis 7.0 (docs/algorithms.md), a full key of 10000
// takes 1.1 MB and at worst 0.7 ms; of 100000, 10 MB and 15 ms, during which
// Redis serves nobody else.
const MaxSlidingLogLimit = 10_000

// algorithmTable is the one list of algorithms, in code order (the order the
// docs present them).
var algorithmTable = [...]AlgorithmInfo{
	{Name: FixedWindow, Code: 1, Suffix: "fw2", Leasable: true, Record: []string{"e", "n"}},
	{Name: SlidingLog, Code: 2, Suffix: "sl2", MaxLimit: MaxSlidingLogLimit},
	{Name: SlidingWindow, Code: 3, Suffix: "sw2", Leasable: true, Record: []string{"e", "c", "p", "d"}},
	{Name: GCRA, Code: 4, Suffix: "gc2", Burst: true, Leasable: true, Record: []string{"t", "f", "l", "p"}},
	{Name: TokenBucket, Code: 5, Suffix: "tb2", Burst: true, Leasable: true, Record: []string{"tokens", "ts", "l", "p", "b"}},
}

// Algorithms lists every algorithm in code order.
var Algorithms = func() []Algorithm {
	out := make([]Algorithm, len(algorithmTable))
	for i, a := range algorithmTable {
		out[i] = a.Name
	}
	return out
}()

// AlgorithmTable returns a copy of the algorithm table, in code order.
func AlgorithmTable() []AlgorithmInfo { return append([]AlgorithmInfo(nil), algorithmTable[:]...) }

// Info returns a's row of the algorithm table; ok is false for a name
// rategate does not implement.
func (a Algorithm) Info() (info AlgorithmInfo, ok bool) {
	for i := range algorithmTable {
		if algorithmTable[i].Name == a {
			return algorithmTable[i], true
		}
	}
	return AlgorithmInfo{}, false
}

// Valid reports whether a is an algorithm rategate implements.
func (a Algorithm) Valid() bool {
	_, ok := a.Info()
	return ok
}

// UsesBurst reports whether the algorithm has a burst separate from its limit.
func (a Algorithm) UsesBurst() bool {
	info, _ := a.Info()
	return info.Burst
}

// Leasable reports whether a rule of the algorithm can be leased exactly.
func (a Algorithm) Leasable() bool {
	info, _ := a.Info()
	return info.Leasable
}

// Code returns the number the Lua drivers use for a, or 0.
func (a Algorithm) Code() int {
	info, _ := a.Info()
	return info.Code
}

// AlgorithmOfKey returns the row of the algorithm whose keys end like key
// (":" and its suffix).
func AlgorithmOfKey(key string) (AlgorithmInfo, bool) {
	for i := range algorithmTable {
		if s := algorithmTable[i].Suffix; len(key) > len(s) && key[len(key)-len(s)-1] == ':' && key[len(key)-len(s):] == s {
			return algorithmTable[i], true
		}
	}
	return AlgorithmInfo{}, false
}

// Suffix returns the key suffix of the algorithm's keys ("xx" for a name
// rategate does not implement, which config validation rejects first).
func (a Algorithm) Suffix() string {
	for i := range algorithmTable {
		if algorithmTable[i].Name == a {
			return algorithmTable[i].Suffix
		}
	}
	return "xx"
}
