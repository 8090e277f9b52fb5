//go:build unix

package server

import "syscall"

// fdReserve are file descriptors kept for the admin listener, the scraper,
// logs and the process itself, whatever the proxy does.
const fdReserve = 256

// fdBudget is how many client connections the open-file limit allows: each
// proxied request holds a client and an upstream descriptor. 0 = unknown.
func fdBudget() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > 1<<30 {
		return 0
	}
	return max(1, (int(lim.Cur)-fdReserve)/2)
}
