package policy

import (
	"fmt"

	"github.com/google/cel-go/cel"
)

// Rule is approve_by_exception's deterministic eligibility rule, a CEL expression over
// action, output (the validated value), validation, evidence (by source, then name) and
// input. It is compiled when the policy loads, so a bad rule stops start-up.
type Rule struct {
	Source  string
	program cel.Program
}

var ruleEnv = func() *cel.Env {
	env, err := cel.NewEnv(
		cel.Variable("action", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("output", cel.DynType),
		cel.Variable("validation", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("evidence", cel.MapType(cel.StringType, cel.MapType(cel.StringType, cel.DynType))),
		cel.Variable("input", cel.MapType(cel.StringType, cel.DynType)),
	)
	if err != nil {
		panic(err)
	}
	return env
}()

func compileRule(src string) (*Rule, error) {
	ast, iss := ruleEnv.Compile(src)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	if ast.OutputType() != cel.BoolType {
		return nil, fmt.Errorf("the rule must be a boolean expression, not %s", ast.OutputType())
	}
	prg, err := ruleEnv.Program(ast, cel.CostLimit(100000))
	if err != nil {
		return nil, err
	}
	return &Rule{Source: src, program: prg}, nil
}

// Eval runs the rule. Any error (a missing field, a wrong type, the cost limit) is an
// error, never a pass: the caller falls back to a person.
func (r *Rule) Eval(vars map[string]any) (bool, error) {
	out, _, err := r.program.Eval(vars)
	if err != nil {
		return false, err
	}
	b, ok := out.Value().(bool)
	if !ok {
		return false, fmt.Errorf("the rule gave %v, not a boolean", out.Value())
	}
	return b, nil
}
