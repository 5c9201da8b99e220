/* Runs every unit test, one line each, then "N passed, N failed, N skipped".
 * Optional argument: run only tests whose name contains it. */
#include <stdlib.h>

#include "../runner.h"
#include "base/common.h"

jmp_buf test_jump;
char test_why[512];
int test_skipped;

#define UNIT_TESTS(X)                                                                        \
  X(half_roundtrip_exhaustive)                                                               \
  X(half_rounding)                                                                           \
  X(bf16_conversion)                                                                         \
  X(reduce_matches_reference)                                                                \
  X(reduce_nan_inf_and_edges)                                                                \
  X(reduce_int16_and_bool)                                                                   \
  X(reduce_in_place_aliasing)                                                                \
  X(scale_as_horovod)                                                                        \
  X(params_parse_values)                                                                     \
  X(params_env_errors_name_variable)                                                         \
  X(params_markdown_lists_every_setting)                                                     \
  X(params_job_encoding_and_difference)                                                      \
  X(params_hierarchical_adasum_follows_horovod)                                              \
  X(params_horovod_aliases_convert)                                                          \
  X(params_horovod_errors_name_variable)                                                     \
  X(params_horovod_logged_once)                                                              \
  X(params_markdown_names_horovod_aliases)                                                   \
  X(message_requests_roundtrip)                                                              \
  X(message_requests_new_dtypes)                                                             \
  X(message_requests_reject_malformed)                                                       \
  X(message_shapes)                                                                          \
  X(message_requests_reject_bad_shapes)                                                      \
  X(message_responses_roundtrip)                                                             \
  X(message_responses_reject_malformed)                                                      \
  X(message_abort_roundtrip)                                                                 \
  X(hello_checks_shape_and_rank)                                                             \
  X(handshake_proves_the_secret_both_ways)                                                   \
  X(rendezvous_choice_follows_the_launcher)                                                  \
  X(rendezvous_bad_variables_are_named)                                                      \
  X(slurm_first_node_of_a_node_list)                                                         \
  X(a_connection_to_itself_is_no_peer)                                                       \
  X(rendezvous_rank_dropped_before_its_claim_connects_again)                                 \
  X(rendezvous_without_a_secret_survives_a_strangers_bad_claim)                              \
  X(settings_length_from_a_peer_is_checked)                                                  \
  X(address_record_from_a_peer_is_checked)                                                   \
  X(agreement_record_from_a_peer_is_checked)                                                 \
  X(minimum_from_a_peer_is_checked)                                                          \
  X(shared_segment_smaller_than_its_layout_is_not_mapped)                                    \
  X(connections_of_another_epoch_are_refused)                                                \
  X(tcp_sockets_get_the_congestion_control_asked_for)                                        \
  X(unix_listener_name_cannot_be_taken_in_advance)                                           \
  X(table_put_get_remove_grow)                                                               \
  X(table_reuses_removed_entries)                                                            \
  X(strerror_covers_every_code)                                                              \
  X(controller_matches_and_orders)                                                           \
  X(controller_mismatch_messages)                                                            \
  X(controller_join_and_shutdown)                                                            \
  X(controller_fuses_compatible_responses)                                                   \
  X(controller_holds_groups_and_fails_them_whole)                                            \
  X(controller_cycle_policy)                                                                 \
  X(message_responses_note_the_cache)                                                        \
  X(cache_lru_and_versions)                                                                  \
  X(cache_forget_empties_a_slot)                                                             \
  X(message_cycle_roundtrip)                                                                 \
  X(cycle_late_fold_any_order)                                                               \
  X(stragglers_name_the_late_rank)                                                           \
  X(stragglers_name_a_slow_host_and_not_an_even_run)                                         \
  X(compression_roundtrip_and_reduce)                                                        \
  X(compression_matches_scalar_conversions)                                                  \
  X(message_minimal_sizes)                                                                   \
  X(checksum_stream_and_sensitivity)                                                         \
  X(path_tuner_size_classes)                                                                 \
  X(path_tuner_runs_both_then_keeps_the_faster)                                              \
  X(path_tuner_decides_by_best_time_after_warm_up)                                           \
  X(path_tuner_counts_trials_in_flight)                                                      \
  X(ctrl_read_is_bounded_while_the_peer_streams)                                             \
  X(ctrl_frames_arrive_whole_in_pieces)                                                      \
  X(ctrl_refuses_malformed_headers)                                                          \
  X(ib_immediates_are_checked_against_the_ring)                                              \
  X(ib_record_roundtrip_and_rejects)                                                         \
  X(cycle_steps_are_checked_on_arrival)                                                      \
  X(cycle_step_sent_again_after_it_was_taken_is_refused)                                     \
  X(cycle_ask_overtaken_by_its_result_is_dropped)                                            \
  X(cycles_schedule_slots_ready_everywhere_and_submitted_somewhere)                          \
  X(cycles_apply_rank_0s_frames_at_their_end)                                                \
  X(cycles_tell_every_rank_someone_joined)                                                   \
  X(cycle_steps_from_the_wrong_rank_or_cycle_fail_naming_it)                                 \
  X(cycle_partner_lost_mid_cycle_fails_with_peer_lost)                                       \
  X(progress_moves_queued_transfers_in_order_and_in_pieces)                                  \
  X(progress_refuses_a_receive_of_another_length)                                            \
  X(progress_fails_both_ends_of_a_broken_link)                                               \
  X(mock_send_taken_before_the_peer_closed_completes)                                        \
  X(mock_peer_never_touches_the_senders_xfer)                                                \
  X(progress_wait_sleeps_and_runs_the_service)                                               \
  X(progress_wait_ends_with_the_service_error)                                               \
  X(progress_wait_times_out_a_stall_naming_the_peer)                                         \
  X(ring_allreduce_matches_direct_reductions)                                                \
  X(ring_broadcast_from_every_root)                                                          \
  X(ring_allgather_in_and_out_of_place)                                                      \
  X(host_collectives_fuse_scale_and_average_over_rings)                                      \
  X(ring_broken_link_fails_every_rank)                                                       \
  X(schedule_allreduce_ring_every_size_dtype_and_fusion)                                     \
  X(schedule_allreduce_rd_every_size_dtype_and_fusion)                                       \
  X(schedule_allreduce_rabenseifner_every_size_dtype_and_fusion)                             \
  X(schedule_allreduce_tree_every_size_dtype_and_fusion)                                     \
  X(schedule_allreduce_tree_every_rank_count)                                                \
  X(schedule_broadcast_ring_every_root)                                                      \
  X(schedule_broadcast_binomial_every_root)                                                  \
  X(schedule_broadcast_scatter_allgather_every_root)                                         \
  X(schedule_allgather_ring_every_size)                                                      \
  X(schedule_allgather_bruck_every_size)                                                     \
  X(schedule_reducescatter_ring_every_size)                                                  \
  X(schedule_reducescatter_halving_every_size)                                               \
  X(schedule_reducescatter_over_each_allreduce)                                              \
  X(schedule_cross_broadcast_and_allgather_every_pick)                                       \
  X(schedule_broken_link_fails_every_rank_rd_bruck_rabenseifner)                             \
  X(schedule_broken_link_fails_every_rank_tree)                                              \
  X(sched_run_fails_a_schedule_that_cannot_move)                                             \
  X(coll_partners_symmetric_and_cover_every_schedule)                                        \
  X(tree_links_two_spanning_trees_among_the_partners)                                        \
  X(selector_picks_by_the_cost_model)                                                        \
  X(selector_hierarchical_broadcast_and_allgather)                                           \
  X(cost_model_setting_numbers_calibrate_and_file)                                           \
  X(cost_model_init_reads_rank_0s_setting_only)                                              \
  X(cost_calibrate_over_mock_links)                                                          \
  X(strangers_flood_never_pushes_out_a_ranks_handshake)                                      \
  X(strangers_forged_claim_cannot_lock_out_the_real_rank)                                    \
  X(strangers_of_another_uid_are_refused_on_the_unix_listener)                               \
  X(metrics_endpoint_out_of_descriptors_does_not_spin)                                       \
  X(metrics_file_temporary_name_does_not_follow_a_symlink)

#define DECLARE(name) void test_##name(void);
UNIT_TESTS(DECLARE)
#define ENTRY(name) {#name, test_##name},
static const struct test_case tests[] = {UNIT_TESTS(ENTRY)};

/* Arguments choose tests: a test runs when its name contains one of the
 * plain ones (all run where there is none) and none of those given as
 * -NAME. */
static bool chosen(const char *name, int argc, char **argv) {
  bool any = false, included = false;
  for (int a = 1; a < argc; a++) {
    if (argv[a][0] == '-') {
      if (strstr(name, argv[a] + 1)) {
        return false;
      }
    } else {
      any = true;
      included = included || strstr(name, argv[a]);
    }
  }
  return !any || included;
}

int main(int argc, char **argv) {
  /* volatile: these live across longjmp. */
  volatile int passed = 0, failed = 0, skipped = 0;
  for (volatile size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
    if (!chosen(tests[i].name, argc, argv)) {
      continue;
    }
    test_skipped = 0;
    test_why[0] = '\0';
    uint64_t t0 = hora__now_ns();
    if (setjmp(test_jump) == 0) {
      tests[i].fn();
      /* The slow ones say so: the suite's minutes are watched. */
      double s = (double)(hora__now_ns() - t0) * 1e-9;
      if (s >= 0.5) {
        printf("PASS unit/%s (%.1f s)\n", tests[i].name, s);
      } else {
        printf("PASS unit/%s\n", tests[i].name);
      }
      passed++;
    } else if (test_skipped) {
      printf("SKIP unit/%s: %s\n", tests[i].name, test_why);
      skipped++;
    } else {
      printf("FAIL unit/%s: %s\n", tests[i].name, test_why);
      failed++;
    }
    fflush(stdout);
  }
  printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed ? 1 : 0;
}
