package main

import (
	"context"
	"errors"
)

func runSim(ctx context.Context, args []string) error {
	return errors.New("not built yet")
}
