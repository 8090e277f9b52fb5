package main

import (
	"context"
	"errors"
)

func runBench(ctx context.Context, args []string) error {
	return errors.New("not built yet")
}
