// Command benchmerge folds test/bench/results/parts/*.json into
// latest.json and latest.md and prints the table.
package main

import (
	"fmt"
	"os"

	"github.com/gpuaas/gpuaas/test/bench"
)

func main() {
	dir, err := bench.ResultsDir()
	if err == nil {
		var ms []bench.Metric
		if ms, err = bench.Merge(dir); err == nil {
			fmt.Print(bench.Markdown(ms))
			return
		}
	}
	fmt.Fprintln(os.Stderr, "benchmerge:", err)
	os.Exit(1)
}
