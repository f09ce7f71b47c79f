/* The examples build and run: each binary exits 0 on a short run.
 *
 * The binaries are found through the environment (TG_EXAMPLE_CUSTOM_OP,
 * TG_EXAMPLE_TRAIN_MLP, TG_EXAMPLE_DIGITS_MLP, TG_EXAMPLE_DIGITS_CNN,
 * TG_EXAMPLE_SEQ_LSTM, TG_EXAMPLE_GRADIENT_PENALTY, TG_EXAMPLE_NEWTON_LOGREG,
 * TG_EXAMPLE_JACOBIAN, TG_EXAMPLE_FUSED_ACTIVATION, set by tests/meson.build)
 * or, when unset, next to this test in the build tree
 * (<build>/examples/<name>). The digits
 * examples find data/digits.csv.gz through the source data dir compiled
 * into them, whatever the working directory. */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

/* Path of example binary name: $env if set, else ../examples/name
 * relative to this executable. */
static void example_path(const char *env, const char *name, char *out, size_t len)
{
    const char *p = getenv(env);
    if (p && p[0]) {
        snprintf(out, len, "%s", p);
        return;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert(n > 0, "%s is not set and /proc/self/exe is unreadable", env);
    self[n] = '\0';
    snprintf(out, len, "%s/../examples/%s", dirname(self), name);
}

/* Runs path with argv (argv[0] filled in) and returns its exit status, or
 * -1 if it did not exit normally. */
static int run(const char *path, char **args)
{
    char *argv[8] = {(char *)path};
    for (int i = 0; args && args[i] && i < 6; i++) argv[i + 1] = args[i];
    cr_assert(access(path, X_OK) == 0, "example binary %s: %s", path, strerror(errno));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        execv(path, argv);
        _exit(127);
    }
    int status;
    cr_assert(waitpid(pid, &status, 0) == pid, "waitpid: %s", strerror(errno));
    if (WIFSIGNALED(status)) cr_log_error("%s killed by signal %d", path, WTERMSIG(status));
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(examples, custom_op_registers_runs_and_gradchecks_its_op)
{
    char path[PATH_MAX + 64];
    example_path("TG_EXAMPLE_CUSTOM_OP", "example_custom_op", path, sizeof path);
    cr_assert_eq(run(path, NULL), 0, "%s did not exit 0", path);
}

Test(examples, train_mlp_lowers_the_loss_in_a_short_run)
{
    char path[PATH_MAX + 64];
    char *args[] = {"--steps", "40", NULL};
    example_path("TG_EXAMPLE_TRAIN_MLP", "example_train_mlp", path, sizeof path);
    cr_assert_eq(run(path, args), 0, "%s --steps 40 did not exit 0", path);
}

Test(examples, fused_activation_trains_as_the_ops_do_bit_for_bit)
{
    char path[PATH_MAX + 64];
    char *args[] = {"--steps", "30", NULL};
    example_path("TG_EXAMPLE_FUSED_ACTIVATION", "example_fused_activation", path, sizeof path);
    cr_assert_eq(run(path, args), 0, "%s --steps 30 did not exit 0", path);
}

Test(examples, train_mlp_rejects_a_step_count_below_one)
{
    char path[PATH_MAX + 64];
    char *args[] = {"--steps", "0", NULL};
    example_path("TG_EXAMPLE_TRAIN_MLP", "example_train_mlp", path, sizeof path);
    cr_assert_eq(run(path, args), 2, "%s --steps 0 should exit 2 (usage)", path);
}

Test(examples, digits_mlp_clears_its_accuracy_bar_after_one_epoch)
{
    char path[PATH_MAX + 64];
    char *args[] = {"--epochs", "1", NULL};
    example_path("TG_EXAMPLE_DIGITS_MLP", "example_digits_mlp", path, sizeof path);
    cr_assert_eq(run(path, args), 0, "%s --epochs 1 did not exit 0", path);
}

Test(examples, digits_cnn_lowers_the_loss_and_clears_its_accuracy_bar_in_two_epochs)
{
    char path[PATH_MAX + 64];
    char *args[] = {"--epochs", "2", NULL};
    example_path("TG_EXAMPLE_DIGITS_CNN", "example_digits_cnn", path, sizeof path);
    cr_assert_eq(run(path, args), 0, "%s --epochs 2 did not exit 0", path);
}

Test(examples, seq_lstm_lowers_the_validation_loss_in_a_short_run)
{
    char path[PATH_MAX + 64];
    char *args[] = {"--steps", "5", NULL};
    example_path("TG_EXAMPLE_SEQ_LSTM", "example_seq_lstm", path, sizeof path);
    cr_assert_eq(run(path, args), 0, "%s --steps 5 did not exit 0", path);
}

/* Second order: each exits 0 only when its own check holds (Newton's
 * gradient norm below 1e-10, the critic separating the sets with its
 * gradient norm near 1, the Jacobian equal to the closed form). */
Test(examples, newton_logreg_converges_with_the_exact_hessian)
{
    char path[PATH_MAX + 64];
    example_path("TG_EXAMPLE_NEWTON_LOGREG", "example_newton_logreg", path, sizeof path);
    cr_assert_eq(run(path, NULL), 0, "%s did not exit 0", path);
    char *few[] = {"--steps", "1", NULL};
    cr_assert_eq(run(path, few), 1, "%s --steps 1 cannot have converged", path);
}

Test(examples, gradient_penalty_critic_trains_to_a_unit_gradient_norm)
{
    char path[PATH_MAX + 64];
    example_path("TG_EXAMPLE_GRADIENT_PENALTY", "example_gradient_penalty", path, sizeof path);
    cr_assert_eq(run(path, NULL), 0, "%s did not exit 0", path);
}

Test(examples, jacobian_matches_the_closed_form)
{
    char path[PATH_MAX + 64];
    example_path("TG_EXAMPLE_JACOBIAN", "example_jacobian", path, sizeof path);
    cr_assert_eq(run(path, NULL), 0, "%s did not exit 0", path);
}

Test(examples, saved_hooks_give_equal_gradients_from_a_file_and_close_ones_from_f32)
{
    char path[PATH_MAX + 64];
    example_path("TG_EXAMPLE_SAVED_HOOKS", "example_saved_hooks", path, sizeof path);
    cr_assert_eq(run(path, NULL), 0, "%s did not exit 0", path);
}
