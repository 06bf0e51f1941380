/* Drives the pmstate-deploy C ABI as a robot's control loop would: opens
 * the tracker, steps it over a sensor stream read from a raw float32 file
 * (per step: dof_pos[D], dof_vel[D], anchor_rot[4], root_local_ang_vel[3],
 * anchor_pos[3]), writes the joint position targets of every step to a raw
 * float32 file, and checks the error paths, the refusal of a bad reading,
 * the safe mode (an operator's stop and the tilt guard, each counted; the
 * measured joints or a configured safe pose) and the flight recorder
 * (logged to LOG; the Rust side replays it bit for bit).
 *
 * usage: replay CHECKPOINT MOTION SENSORS.bin STEPS OUT.bin LOG */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pmstate_deploy.h"

#define CHECK(cond, ...)                      \
  do {                                        \
    if (!(cond)) {                            \
      fprintf(stderr, "replay.c: " __VA_ARGS__); \
      fprintf(stderr, "\n");                  \
      return 1;                               \
    }                                         \
  } while (0)

int main(int argc, char **argv) {
  CHECK(argc == 7, "usage: replay CHECKPOINT MOTION SENSORS.bin STEPS OUT.bin LOG");
  long steps = strtol(argv[4], NULL, 10);

  /* a missing checkpoint is an error with a reason */
  PmstateTracker *bad = NULL;
  CHECK(pmstate_tracker_open("/nonexistent/last.ckpt", argv[2], NULL, &bad) == PMSTATE_ERROR,
        "opening a missing checkpoint did not fail");
  CHECK(strlen(pmstate_tracker_last_error()) > 0, "no reason for the failed open");
  CHECK(bad == NULL, "a failed open wrote a tracker");
  CHECK(pmstate_tracker_open(NULL, argv[2], NULL, &bad) == PMSTATE_NULL_ARGUMENT, "null checkpoint accepted");

  /* ProtoMotions' own loop: the envelope's clamps off, so the targets can
   * be compared with the recorded Python loop's */
  PmstateOptions opts;
  CHECK(pmstate_tracker_default_options(&opts) == PMSTATE_OK, "default options");
  opts.joint_limits = 0;
  opts.rate_limit = 0;
  PmstateOptions wrong_opts = opts;
  wrong_opts.action_ema_alpha = 1.5;
  CHECK(pmstate_tracker_open_with(argv[1], argv[2], NULL, &wrong_opts, &bad) == PMSTATE_ERROR, "alpha 1.5 accepted");
  CHECK(strstr(pmstate_tracker_last_error(), "action_ema_alpha") != NULL, "reason: %s", pmstate_tracker_last_error());
  PmstateTracker *t = NULL;
  PmstateStatus s = pmstate_tracker_open_with(argv[1], argv[2], NULL, &opts, &t);
  CHECK(s == PMSTATE_OK, "open: %s", pmstate_tracker_last_error());
  CHECK(pmstate_tracker_record(t, argv[6]) == PMSTATE_OK, "record: %s", pmstate_tracker_last_error());
  size_t nd = pmstate_tracker_num_dofs(t);
  CHECK(nd > 0, "no joints");
  CHECK(pmstate_tracker_num_bodies(t) > 0, "no bodies");

  size_t row = 2 * nd + 10;
  float *in = malloc(sizeof(float) * row * (size_t)steps);
  float *targets = malloc(sizeof(float) * nd * (size_t)steps);
  float *stiffness = malloc(sizeof(float) * nd);
  float *damping = malloc(sizeof(float) * nd);
  CHECK(in && targets && stiffness && damping, "out of memory");
  FILE *f = fopen(argv[3], "rb");
  CHECK(f != NULL, "cannot open %s", argv[3]);
  CHECK(fread(in, sizeof(float) * row, (size_t)steps, f) == (size_t)steps, "short sensor file");
  fclose(f);

  for (long k = 0; k < steps; k++) {
    const float *r = in + row * (size_t)k;
    PmstateSensors sensors;
    memset(&sensors, 0, sizeof sensors); /* no body state: the g1 tracker reads none */
    sensors.dof_pos = r;
    sensors.dof_vel = r + nd;
    sensors.num_dofs = nd;
    memcpy(sensors.anchor_rot, r + 2 * nd, sizeof(float) * 4);
    memcpy(sensors.root_local_ang_vel, r + 2 * nd + 4, sizeof(float) * 3);
    sensors.anchor_pos = r + 2 * nd + 7;
    s = pmstate_tracker_step(t, &sensors, targets + nd * (size_t)k, stiffness, damping, nd);
    CHECK(s == PMSTATE_OK, "step %ld: %s", k, pmstate_tracker_last_error());
    if (k == 0) {
      /* the error paths leave the tracker usable */
      CHECK(pmstate_tracker_step(t, NULL, targets, NULL, NULL, nd) == PMSTATE_NULL_ARGUMENT, "null sensors accepted");
      CHECK(pmstate_tracker_step(t, &sensors, targets + nd, NULL, NULL, nd + 1) == PMSTATE_ERROR, "wrong num_dofs accepted");
      CHECK(strstr(pmstate_tracker_last_error(), "joints") != NULL, "reason: %s", pmstate_tracker_last_error());
      /* body state for one body more than the robot has: refused before it is read */
      size_t nb = pmstate_tracker_num_bodies(t) + 1;
      float *body = calloc(nb * 4, sizeof(float));
      CHECK(body != NULL, "out of memory");
      PmstateSensors wrong = sensors;
      wrong.body_pos = body;
      wrong.body_rot = body;
      wrong.body_vel = body;
      wrong.body_ang_vel = body;
      wrong.num_bodies = nb;
      CHECK(pmstate_tracker_step(t, &wrong, targets + nd, NULL, NULL, nd) == PMSTATE_ERROR, "wrong num_bodies accepted");
      CHECK(strstr(pmstate_tracker_last_error(), "bodies") != NULL, "reason: %s", pmstate_tracker_last_error());
      free(body);
      /* a NaN reading is refused: nothing written, the state as it was */
      float nan_pos[64], probe[64];
      CHECK(nd <= 64, "too many joints for this test");
      memcpy(nan_pos, r, sizeof(float) * nd);
      nan_pos[3] = 0.0f / 0.0f;
      PmstateSensors glitch = sensors;
      glitch.dof_pos = nan_pos;
      for (size_t j = 0; j < nd; j++) probe[j] = 12345.0f;
      CHECK(pmstate_tracker_step(t, &glitch, probe, NULL, NULL, nd) == PMSTATE_REFUSED, "a NaN reading was not refused");
      CHECK(strstr(pmstate_tracker_last_error(), "dof_pos") != NULL, "reason: %s", pmstate_tracker_last_error());
      CHECK(probe[0] == 12345.0f, "a refused step wrote targets");
      PmstateTrackerStatus st;
      CHECK(pmstate_tracker_status(t, &st) == PMSTATE_OK, "status");
      CHECK(st.refused_readings == 1 && st.steps == 1 && st.safe_mode == 0, "status after the refusal");
    }
  }
  CHECK(stiffness[0] > 0.0f && damping[0] > 0.0f, "no gains");

  /* after a reset the first step is the same again */
  float again[64];
  CHECK(nd <= 64, "too many joints for this test");
  CHECK(pmstate_tracker_reset(t) == PMSTATE_OK, "reset");
  PmstateSensors first = {in, in + nd, nd, {0}, {0}, in + 2 * nd + 7, NULL, NULL, NULL, NULL, 0, 0.0f, 0, 0.0, 0.0};
  memcpy(first.anchor_rot, in + 2 * nd, sizeof(float) * 4);
  memcpy(first.root_local_ang_vel, in + 2 * nd + 4, sizeof(float) * 3);
  CHECK(pmstate_tracker_step(t, &first, again, NULL, NULL, nd) == PMSTATE_OK, "step after reset: %s",
        pmstate_tracker_last_error());
  CHECK(memcmp(again, targets, sizeof(float) * nd) == 0, "the first step after a reset differs");

  /* an operator's stop: the safe mode, the measured joints as targets */
  CHECK(pmstate_tracker_stop(t) == PMSTATE_OK, "stop");
  CHECK(pmstate_tracker_step(t, &first, again, NULL, NULL, nd) == PMSTATE_OK, "safe step: %s", pmstate_tracker_last_error());
  CHECK(memcmp(again, in, sizeof(float) * nd) == 0, "the safe mode's targets are not the measured joints");
  PmstateTrackerStatus st;
  CHECK(pmstate_tracker_status(t, &st) == PMSTATE_OK, "status");
  CHECK(st.safe_mode == 5 && st.safe_mode_steps == 1 && (st.last_events & 2), "status in the safe mode");
  CHECK(st.operator_stops == 1 && st.tilt_trips == 0 && st.stale_trips == 0 && st.non_finite_outputs == 0 &&
            st.end_of_clip_stops == 0,
        "the stop's counts: operator %llu, tilt %llu", (unsigned long long)st.operator_stops,
        (unsigned long long)st.tilt_trips);
  CHECK(pmstate_tracker_reset(t) == PMSTATE_OK, "reset");
  CHECK(pmstate_tracker_status(t, &st) == PMSTATE_OK && st.safe_mode == 0, "the reset left the safe mode");
  CHECK(pmstate_tracker_finish_recording(t) == PMSTATE_OK, "finish recording: %s", pmstate_tracker_last_error());
  pmstate_tracker_close(t);

  /* the tilt guard: an upside-down anchor enters the safe mode */
  PmstateOptions tilted = opts;
  tilted.max_tilt = 1.0f;
  CHECK(pmstate_tracker_open_with(argv[1], argv[2], NULL, &tilted, &t) == PMSTATE_OK, "open: %s", pmstate_tracker_last_error());
  PmstateSensors upside_down = first;
  upside_down.anchor_rot[0] = 1.0f;
  upside_down.anchor_rot[1] = 0.0f;
  upside_down.anchor_rot[2] = 0.0f;
  upside_down.anchor_rot[3] = 0.0f;
  CHECK(pmstate_tracker_step(t, &upside_down, again, NULL, NULL, nd) == PMSTATE_OK, "tilted step: %s", pmstate_tracker_last_error());
  CHECK(pmstate_tracker_status(t, &st) == PMSTATE_OK && st.safe_mode == 1, "the tilt guard did not trip");
  CHECK(st.tilt_trips == 1 && st.operator_stops == 0, "the tilt's counts: tilt %llu, operator %llu",
        (unsigned long long)st.tilt_trips, (unsigned long long)st.operator_stops);
  CHECK(memcmp(again, in, sizeof(float) * nd) == 0, "the tilt's safe targets are not the measured joints");
  /* upright again: still latched until a reset */
  CHECK(pmstate_tracker_step(t, &first, again, NULL, NULL, nd) == PMSTATE_OK, "step");
  CHECK(pmstate_tracker_status(t, &st) == PMSTATE_OK && st.safe_mode == 1 && st.safe_mode_steps == 2, "not latched");
  CHECK(st.tilt_trips == 1, "a latched safe mode tripped again: %llu", (unsigned long long)st.tilt_trips);
  pmstate_tracker_close(t);
  pmstate_tracker_close(NULL);

  /* a configured safe pose: the safe mode's targets are that pose (the
   * clamps off, so exactly); one of the wrong length is refused at open */
  float pose[64];
  for (size_t j = 0; j < nd; j++) pose[j] = 0.01f * (float)j - 0.1f;
  PmstateOptions posed = opts;
  CHECK(posed.safe_pose == NULL && posed.safe_pose_len == 0, "the default safe pose is not the measured one");
  posed.safe_pose = pose;
  posed.safe_pose_len = nd - 1;
  CHECK(pmstate_tracker_open_with(argv[1], argv[2], NULL, &posed, &t) == PMSTATE_ERROR, "a short safe pose accepted");
  CHECK(strstr(pmstate_tracker_last_error(), "safe_pose_len") != NULL, "reason: %s", pmstate_tracker_last_error());
  posed.safe_pose_len = nd;
  CHECK(pmstate_tracker_open_with(argv[1], argv[2], NULL, &posed, &t) == PMSTATE_OK, "open: %s", pmstate_tracker_last_error());
  CHECK(pmstate_tracker_step(t, &first, again, NULL, NULL, nd) == PMSTATE_OK, "step: %s", pmstate_tracker_last_error());
  CHECK(memcmp(again, pose, sizeof(float) * nd) != 0, "the policy's targets were the safe pose before any stop");
  CHECK(pmstate_tracker_stop(t) == PMSTATE_OK, "stop");
  CHECK(pmstate_tracker_step(t, &first, again, stiffness, damping, nd) == PMSTATE_OK, "safe step: %s",
        pmstate_tracker_last_error());
  CHECK(memcmp(again, pose, sizeof(float) * nd) == 0, "the safe mode's targets are not the configured pose");
  CHECK(memcmp(again, in, sizeof(float) * nd) != 0, "the safe mode's targets are the measured joints");
  CHECK(damping[0] > 0.0f, "no damping in the safe mode");
  CHECK(pmstate_tracker_status(t, &st) == PMSTATE_OK && st.safe_mode == 5 && st.operator_stops == 1,
        "status with the configured pose");
  pmstate_tracker_close(t);

  f = fopen(argv[5], "wb");
  CHECK(f != NULL, "cannot write %s", argv[5]);
  CHECK(fwrite(targets, sizeof(float) * nd, (size_t)steps, f) == (size_t)steps, "short write");
  fclose(f);
  free(in);
  free(targets);
  free(stiffness);
  free(damping);
  printf("replay.c: %ld steps, %zu joints\n", steps, nd);
  return 0;
}
