/* hora-info's views of the collective algorithms (info_model.c). */
#ifndef HORA_INFO_MODEL_H
#define HORA_INFO_MODEL_H

/* --algorithms: every registered algorithm, by kind. */
int hora_info_algorithms(void);
/* --model [options]: each algorithm's predicted time for a layout. */
int hora_info_model(int argc, char **argv);

#endif
