package lua

import "github.com/rategate/rategate/limits"

// algorithmFiles is the algorithm table as these tests walk it: each
// algorithm's script file and function name, in code order.
var algorithmFiles = func() []struct{ file, fn string } {
	var out []struct{ file, fn string }
	for _, a := range limits.AlgorithmTable() {
		out = append(out, struct{ file, fn string }{string(a.Name) + ".lua", string(a.Name)})
	}
	return out
}()

// Code returns the driver code of an algorithm name, or 0.
func Code(name string) int { return limits.Algorithm(name).Code() }
