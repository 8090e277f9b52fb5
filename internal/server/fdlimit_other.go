//go:build !unix

package server

// fdBudget is unknown off unix: server.max_connections applies as is.
func fdBudget() int { return 0 }
