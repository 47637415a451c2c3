// Command hostsim writes a simulated HGX H200 host root for the lab:
//
//	hostsim -profile j22u15 -out /var/tmp/lab/j22u15
//	hostsim -list
//
// The agent then runs against it with its host root pointed at -out.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpuaas/gpuaas/lab/hostsim"
)

func main() {
	profile := flag.String("profile", "j22u15", "host profile ("+strings.Join(hostsim.Profiles(), ", ")+")")
	out := flag.String("out", "", "directory to write the host root into (missing or empty)")
	list := flag.Bool("list", false, "list the host profiles and exit")
	flag.Parse()
	if *list {
		for _, p := range hostsim.Profiles() {
			prof, _, err := hostsim.LoadProfile(p)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			fmt.Printf("%s\t%s\t%s\n", p, prof.Role, prof.MAASIP)
		}
		return
	}
	if *out == "" {
		fmt.Fprintln(os.Stderr, "hostsim: -out is required")
		os.Exit(2)
	}
	base, err := filepath.Abs(*out)
	if err == nil {
		_, err = hostsim.Generate(base, *profile)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostsim:", err)
		os.Exit(1)
	}
	fmt.Println(base)
}
