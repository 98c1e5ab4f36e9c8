// Command print writes one of rategate's assembled Redis scripts to
// standard output, so that it can be run by hand:
//
//	go run ./lua/print lease > /tmp/lease.lua
//	redis-cli --eval /tmp/lease.lua rg:{demo:}:fw2 rg:{demo:}:lease , 0 take 1 100 60000000 100 1 10 a-1 0
//
// The argument names the script: decide, decide_many, refund or lease.
package main

import (
	"fmt"
	"os"

	"github.com/rategate/rategate/lua"
)

func main() {
	scripts := map[string]func() (string, error){"decide": lua.Decide, "decide_many": lua.DecideMany, "refund": lua.Refund, "lease": lua.Lease}
	if len(os.Args) != 2 || scripts[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: go run ./lua/print decide|decide_many|refund|lease")
		os.Exit(2)
	}
	src, err := scripts[os.Args[1]]()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(src)
}
