"""Trajectories played on real games, analyzed by the oracle analyzer and judged by the oracle judge."""

from seedfast.envs import Trajectory, TrajectoryStep
from seedfast.envs.textworld_env import TextWorldEnv
from seedfast.skills import OracleAnalyzer, OracleJudge, build_analyzer_messages, parse_reflection


def rollout(record, actions):
    env = TextWorldEnv(record.path)
    obs = env.reset()
    trajectory = Trajectory(task=obs.task, game_id=env.game_id, walkthrough=record.walkthrough)
    for action in actions:
        next_obs, reward, done, info = env.step(action)
        trajectory.steps.append(TrajectoryStep(obs.text, obs.admissible_actions, action, valid=info["valid"],
                                               reward=reward))
        obs = next_obs
        if done:
            trajectory.won = info["won"]
            trajectory.final_observation = obs.text
            break
    env.close()
    return trajectory


def test_oracle_skills_for_a_win_and_a_failure(games):
    record = games["treasure_hunter"][0]
    first_move, take = record.walkthrough
    env = TextWorldEnv(record.path)
    detour = next(a for a in env.reset().admissible_actions if a.startswith("go ") and a != first_move)
    env.close()
    win = rollout(record, record.walkthrough)
    loss = rollout(record, [detour, "look"])
    assert win.won and not loss.won

    results = OracleAnalyzer(skill_mode="episode_step").analyze([win, loss])
    assert all(r.valid for r in results)
    assert f"{first_move} -> {take}" in results[0].skill
    assert results[0].step_skills == {0: f"Do '{first_move}' now.", 1: f"Do '{take}' now."}
    assert results[1].skill.endswith(f"At step 0 do '{first_move}': the agent left the walkthrough there.")
    assert detour not in results[1].skill  # the wrong command is never quoted: the reader copies quoted commands
    assert results[1].step_skills == {0: f"Do '{first_move}' now."}

    prompt = build_analyzer_messages(loss)[1]["content"]
    assert "Outcome: FAILED" in prompt and f"Action: {detour}" in prompt and record.objective in prompt

    good = (f"1. At step 0 I did {detour}, away from the goal.\n2. I should have done {first_move} first.\n"
            f"3. Then {take}.")
    vague = "1. Things went wrong somewhere.\n2. I should read more carefully.\n3. Try harder next time."
    assert parse_reflection(good).valid
    assert OracleJudge().score([loss, loss, loss], [good, vague, "no idea"]) == [3, 1, 0]
